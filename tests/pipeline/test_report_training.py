"""The run's report says how training went: a rerun that reused a finished checkpoint, or a fresh run."""

from __future__ import annotations

import json
from pathlib import Path

from tpuflow.pipeline.steps import training_summary, write_report

REUSED = {
    "run_name": "jax-tpu-v6e-4x4",
    "checkpoint": "/out/2026-11-02/train/jax-tpu-v6e-4x4/checkpoint_000009",
    "resumed_from": "/out/2026-11-02/train/jax-tpu-v6e-4x4/checkpoint_000009",
    "reused_finished": True,
    "steps_trained": 0,
    "metrics": {"step": 1500},
}


def test_a_reused_finished_checkpoint_is_stated_in_report_json(tmp_path: Path) -> None:
    report = write_report(str(tmp_path), {"accuracy": 0.97}, None, None, training=training_summary(REUSED))
    training = json.loads((tmp_path / "report.json").read_text())["training"]
    assert training == report["training"]
    assert (training["reused_finished"], training["steps_trained"]) == (True, 0)
    assert training["resumed_from"] == REUSED["checkpoint"]
    assert training["note"] == (
        f"reused the finished checkpoint {REUSED['checkpoint']} of an earlier run of this date: 0 steps trained; "
        "set Param resume=never to train again"
    )


def test_a_run_that_trained_has_no_reuse_note() -> None:
    fresh = {**REUSED, "run_name": "jax-tpu-v6e-4x4-fresh2", "resumed_from": None, "reused_finished": False,
             "steps_trained": 1500}  # fmt: skip
    summary = training_summary(fresh)
    assert summary == {"run_name": "jax-tpu-v6e-4x4-fresh2", "checkpoint": REUSED["checkpoint"],
                       "resumed_from": None, "steps_trained": 1500, "reused_finished": False}  # fmt: skip
    assert training_summary({"checkpoint": "/c"})["reused_finished"] is False  # an older driver's result
