"""The ledger page's rows, table and chart (the route reads the chip_ledger XComs; these render them)."""

from __future__ import annotations

from tpuflow.cost.ledger import build_ledger, slice_entry
from tpuflow.ui.ledger import ledger_chart_svg, ledger_rows, ledger_table


def _ledger(train_s: float, prices: dict[str, float] | None = None) -> dict:
    slices = [slice_entry("train", "v6e", 16, 0.0, 3600.0), slice_entry("serve", "v6e", 1, 0.0, None, now=1800.0)]
    return build_ledger(slices, training_seconds=train_s, training_chips=16, prices=prices)


def test_rows_table_and_chart() -> None:
    records = [
        ("tpu_llm_pipeline_gke", "manual__b", _ledger(3000, {"v6e": 2.0})),
        ("tpu_llm_pipeline_gke", "manual__a", _ledger(1800)),
        ("tpu_llm_pipeline_gke", "broken", "not a ledger"),
    ]
    rows = ledger_rows(records)
    assert [r["run_id"] for r in rows] == ["manual__b", "manual__a"]
    assert rows[0]["chip_hours"] == 16.5 and rows[0]["open"] is True and rows[0]["cost"] == 33.0
    assert rows[1]["cost"] is None and rows[1]["ratio"] == 2.062
    table = ledger_table(rows)
    assert "33.00 USD" in table and "16.5000 (still held)" in table and "train: 16 x v6e 3600 s" in table
    svg = ledger_chart_svg(rows)
    assert svg.count("<rect") == 4 and "manual__a" in svg
    assert ledger_chart_svg([]) == "" and "No ledgers yet" in ledger_table([])


def test_names_are_escaped() -> None:
    rows = ledger_rows([("<dag>", "run&1", _ledger(100))])
    assert "&lt;dag&gt;" in ledger_table(rows) and "run&amp;1" in ledger_chart_svg(rows)


def _timed_ledger() -> dict:
    from tpuflow.cost.goodput import run_goodput, slice_timeline

    train = slice_entry("train", "v6e", 16, 0.0, 1000.0)
    works = [{"cause": "training", "started_at": 100.0, "ended_at": 900.0,
              "breakdown": {"compile": 50.0, "productive": 600.0, "preemption": 100.0}}]  # fmt: skip
    train["timeline"] = slice_timeline(0.0, 1000.0, works, now=1000.0, provisioned_at=60.0)
    ledger = build_ledger([train])
    ledger["goodput"] = run_goodput([train])
    return ledger


def test_goodput_column_chart_and_each_runs_timeline() -> None:
    from tpuflow.ui.ledger import goodput_chart_svg, timelines_html

    rows = ledger_rows([("acme_train", "manual__g", _timed_ledger()), ("acme_train", "old", _ledger(100))])
    assert rows[0]["goodput"] == 0.6 and rows[1]["goodput"] is None
    table = ledger_table(rows)
    assert "<td>60 %</td>" in table and "preemption 10 %" in table
    chart = goodput_chart_svg(rows)  # runs without a measured timeline have no bar
    assert "manual__g" in chart and "old" not in chart and "60 %" in chart
    page = timelines_html(rows)
    # the slice's span cut in order: provisioning, cluster start, training (split below), idle after it
    causes = [c for c in ("provisioning", "cluster_start", "training", "idle") if f"data-cause='{c}'" in page]
    assert causes == ["provisioning", "cluster_start", "training", "idle"]
    assert "goodput 60 %" in page and "productive steps 60 %" in page and "held idle 10 %" in page
    assert "productive steps: 600 s of the training job" in page  # the job drawn split as its loop measured it
    assert timelines_html(ledger_rows([("d", "r", _ledger(100))])) == ""
