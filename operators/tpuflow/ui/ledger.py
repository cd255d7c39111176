"""The chip-hour ledger page's content: one row per run (its chip_ledger XCom) and a bar chart.

Pure functions (the route in tpuflow.ui.app reads the XComs from the metadata DB and renders these).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any


def ledger_rows(records: Iterable[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """(dag_id, run_id, ledger XCom) -> table rows, newest first as given; malformed values are skipped."""
    rows = []
    for dag_id, run_id, ledger in records:
        if not isinstance(ledger, Mapping) or "chip_hours" not in ledger:
            continue
        slices = ledger.get("slices") or []
        rows.append(
            {
                "dag_id": dag_id,
                "run_id": run_id,
                "chip_hours": float(ledger.get("chip_hours") or 0.0),
                "training_chip_hours": float(ledger.get("training_chip_hours") or 0.0),
                "ratio": ledger.get("chip_hours_ratio"),
                "cost": ledger.get("cost"),
                "currency": ledger.get("currency", ""),
                "open": bool(ledger.get("open")),
                "slices": ", ".join(
                    f"{s.get('role')}: {s.get('chips')} x {s.get('generation')} {float(s.get('seconds') or 0):.0f} s"
                    for s in slices
                    if isinstance(s, Mapping)
                ),
            }
        )
    return rows


def ledger_chart_svg(rows: list[dict[str, Any]], width: int = 720, bar: int = 16) -> str:
    """Horizontal bars: billed chip-hours per run, the training part darker."""
    if not rows:
        return ""
    top = max(r["chip_hours"] for r in rows) or 1.0
    label_w, gap = 260, 6
    scale = (width - label_w - 90) / top
    parts = []
    for i, r in enumerate(rows):
        y = i * (bar + gap)
        billed, trained = r["chip_hours"] * scale, min(r["training_chip_hours"], r["chip_hours"]) * scale
        name = html.escape(f"{r['dag_id']} {r['run_id']}"[:42])
        parts.append(
            f"<text x='0' y='{y + bar - 4}' font-size='11'>{name}</text>"
            f"<rect x='{label_w}' y='{y}' width='{billed:.1f}' height='{bar}' fill='#9ec5fe'/>"
            f"<rect x='{label_w}' y='{y}' width='{trained:.1f}' height='{bar}' fill='#0d6efd'/>"
            f"<text x='{label_w + billed + 4:.1f}' y='{y + bar - 4}' font-size='11'>{r['chip_hours']:.3f}</text>"
        )
    height = len(rows) * (bar + gap)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
        f"aria-label='chip-hours per run'>{''.join(parts)}</svg>"
        "<p><span style='color:#0d6efd'>&#9632;</span> training &nbsp; "
        "<span style='color:#9ec5fe'>&#9632;</span> billed (slice held, not training)</p>"
    )


def ledger_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>No ledgers yet: each pipeline run records one in its chip_ledger task.</p>"

    def cell(row: dict[str, Any]) -> str:
        cost = "" if row["cost"] is None else f"{row['cost']:.2f} {html.escape(str(row['currency']))}"
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
        state = " (still held)" if row["open"] else ""
        return (
            f"<tr><td>{html.escape(row['dag_id'])}</td><td>{html.escape(row['run_id'])}</td>"
            f"<td>{row['chip_hours']:.4f}{state}</td><td>{row['training_chip_hours']:.4f}</td><td>{ratio}</td>"
            f"<td>{cost}</td><td>{html.escape(row['slices'])}</td></tr>"
        )

    return (
        "<table><tr><th>DAG</th><th>run</th><th>chip-hours</th><th>training</th><th>billed / training</th>"
        f"<th>cost</th><th>slices</th></tr>{''.join(cell(r) for r in rows)}</table>"
    )
