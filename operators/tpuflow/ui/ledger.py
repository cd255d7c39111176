"""The chip-hour ledger page's content: one row per run (its chip_ledger XCom), a bar chart, goodput over recent
runs and each recent run's timeline (where every billed chip-second of each slice went, tpuflow.cost.goodput).

Pure functions (the route in tpuflow.ui.app reads the XComs from the metadata DB and renders these).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

from tpuflow.cost.goodput import LABELS


def ledger_rows(records: Iterable[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """(dag_id, run_id, ledger XCom) -> table rows, newest first as given; malformed values are skipped."""
    rows = []
    for dag_id, run_id, ledger in records:
        if not isinstance(ledger, Mapping) or "chip_hours" not in ledger:
            continue
        slices = ledger.get("slices") or []
        raw_goodput = ledger.get("goodput")
        goodput: Mapping[str, Any] = raw_goodput if isinstance(raw_goodput, Mapping) else {}
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
                "goodput": goodput.get("goodput"),
                "badput": [b for b in goodput.get("badput", []) if isinstance(b, Mapping)][:2],
                "timelines": [
                    (f"{s.get('role')}: {s.get('chips')} chips", s["timeline"])
                    for s in slices
                    if isinstance(s, Mapping) and isinstance(s.get("timeline"), Mapping)
                ],
                "chip_seconds": dict(goodput.get("chip_seconds") or {}),
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
        goodput = "" if row.get("goodput") is None else f"{row['goodput'] * 100:.0f} %"
        badput = ", ".join(
            f"{LABELS.get(b['cause'], b['cause'])} {b['share'] * 100:.0f} %" for b in row.get("badput", [])
        )
        return (
            f"<tr><td>{html.escape(row['dag_id'])}</td><td>{html.escape(row['run_id'])}</td>"
            f"<td>{row['chip_hours']:.4f}{state}</td><td>{row['training_chip_hours']:.4f}</td><td>{ratio}</td>"
            f"<td>{goodput}</td><td>{html.escape(badput)}</td>"
            f"<td>{cost}</td><td>{html.escape(row['slices'])}</td></tr>"
        )

    return (
        "<table><tr><th>DAG</th><th>run</th><th>chip-hours</th><th>training</th><th>billed / training</th>"
        "<th>goodput</th><th>top badput</th>"
        f"<th>cost</th><th>slices</th></tr>{''.join(cell(r) for r in rows)}</table>"
    )


# one colour per cause: greens for what the slice was held for, warm colours for badput, grey for idle
COLOURS = {
    "productive": "#198754",
    "evaluation": "#b6d4fe",
    "serving": "#20c997",
    "job": "#a3cfbb",
    "training": "#6c757d",
    "provisioning": "#6f42c1",
    "cluster_start": "#a370f7",
    "data_prep": "#0dcaf0",
    "preflight": "#3d8bfd",
    "startup": "#fd7e14",
    "compile": "#ffc107",
    "data_wait": "#e685b5",
    "checkpoint": "#0d6efd",
    "restore": "#d63384",
    "preemption": "#dc3545",
    "failure": "#842029",
    "redone": "#b02a37",
    "idle": "#ced4da",
}


TRAINING_PARTS = ("startup", "restore", "compile", "data_wait", "productive", "checkpoint", "preemption", "failure",
                  "redone")  # fmt: skip


def _colour(cause: str) -> str:
    return COLOURS.get(cause, "#adb5bd")


def goodput_chart_svg(rows: list[dict[str, Any]], width: int = 720, bar: int = 16) -> str:
    """Goodput over recent runs: one bar per run, its billed chip-seconds stacked by cause (productive first)."""
    rows = [r for r in rows if r.get("chip_seconds")]
    if not rows:
        return ""
    label_w, gap = 260, 6
    parts = []
    for i, r in enumerate(rows):
        y = i * (bar + gap)
        total = sum(r["chip_seconds"].values()) or 1.0
        x = float(label_w)
        order = sorted(r["chip_seconds"].items(), key=lambda kv: (kv[0] != "productive", -kv[1]))
        for cause, value in order:
            w = value / total * (width - label_w - 60)
            parts.append(
                f"<rect x='{x:.1f}' y='{y}' width='{w:.1f}' height='{bar}' fill='{_colour(cause)}'>"
                f"<title>{html.escape(LABELS.get(cause, cause))}: {value / total * 100:.1f} %</title></rect>"
            )
            x += w
        name = html.escape(f"{r['dag_id']} {r['run_id']}"[:42])
        shown = "-" if r.get("goodput") is None else f"{r['goodput'] * 100:.0f} %"
        parts.append(f"<text x='0' y='{y + bar - 4}' font-size='11'>{name}</text>")
        parts.append(f"<text x='{x + 4:.1f}' y='{y + bar - 4}' font-size='11'>{shown}</text>")
    height = len(rows) * (bar + gap)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
        f"aria-label='goodput per run'>{''.join(parts)}</svg>"
    )


def timeline_svg(row: dict[str, Any], width: int = 720, bar: int = 18) -> str:
    """One run's slices on one time axis: each slice's billed span cut into what it was doing."""
    lanes = [(name, t["segments"], t.get("seconds", {})) for name, t in row.get("timelines", []) if t.get("segments")]
    if not lanes:
        return ""
    start = min(seg[0] for _, segs, _ in lanes for seg in segs)
    end = max(seg[1] for _, segs, _ in lanes for seg in segs)
    label_w, gap = 120, 8
    scale = (width - label_w - 10) / max(end - start, 1e-9)
    parts = []
    for i, (name, segs, seconds) in enumerate(lanes):
        y = i * (bar + gap)
        parts.append(f"<text x='0' y='{y + bar - 5}' font-size='11'>{html.escape(name)}</text>")
        # a training job is drawn split as its loop measured it (proportions, not the order the parts came in)
        split = [(c, seconds[c]) for c in TRAINING_PARTS if seconds.get(c)]
        split_total = sum(v for _, v in split)
        for a, b, cause in segs:
            x, w = label_w + (a - start) * scale, max((b - a) * scale, 0.5)
            parts.append(
                f"<rect x='{x:.1f}' y='{y}' width='{w:.1f}' height='{bar}' fill='{_colour(cause)}' "
                f"data-cause='{html.escape(cause)}'><title>{html.escape(LABELS.get(cause, cause))}: {b - a:.0f} s"
                "</title></rect>"
            )
            if cause == "training" and split_total > 0:
                for part, value in split:
                    pw = w * value / split_total
                    parts.append(
                        f"<rect x='{x:.1f}' y='{y + 3}' width='{pw:.1f}' height='{bar - 6}' fill='{_colour(part)}'>"
                        f"<title>{html.escape(LABELS.get(part, part))}: {value:.0f} s of the training job</title></rect>"
                    )
                    x += pw
    height = len(lanes) * (bar + gap) + 14
    parts.append(f"<text x='{label_w}' y='{height - 2}' font-size='10'>0 s</text>")
    parts.append(f"<text x='{width - 60}' y='{height - 2}' font-size='10'>{end - start:.0f} s</text>")
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
        f"aria-label='slice timeline'>{''.join(parts)}</svg>"
    )


def timelines_html(rows: list[dict[str, Any]]) -> str:
    """The newest runs' timelines, each with its chip-seconds by cause, and the colour key."""
    shown = [r for r in rows if r.get("timelines")]
    if not shown:
        return ""
    causes = sorted({c for r in shown for c in r.get("chip_seconds", {})}, key=lambda c: list(COLOURS).index(c)
                    if c in COLOURS else len(COLOURS))  # fmt: skip
    key = " &nbsp; ".join(
        f"<span style='color:{_colour(c)}'>&#9632;</span> {html.escape(LABELS.get(c, c))}" for c in causes
    )
    blocks = []
    for r in shown:
        total = sum(r["chip_seconds"].values()) or 1.0
        shares = ", ".join(
            f"{html.escape(LABELS.get(c, c))} {v / total * 100:.0f} %" for c, v in r["chip_seconds"].items() if v
        )
        goodput = "not measured" if r.get("goodput") is None else f"{r['goodput'] * 100:.0f} %"
        blocks.append(
            f"<h3>{html.escape(r['dag_id'])} {html.escape(r['run_id'])}: goodput {goodput}</h3>"
            f"{timeline_svg(r)}<p class='shares'>{shares}</p>"
        )
    return f"<h2>Where the chip time went</h2><p>{key}</p>{''.join(blocks)}"
