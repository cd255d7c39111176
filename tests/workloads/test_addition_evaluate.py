"""The evaluate entrypoint: Ray Data batch inference over the held-out parquet set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from addition import evaluate
from addition.inference import Predictor, exact_match
from tpuflow_driver.result import parse_result


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_evaluate_matches_in_process_exact_match(
    framework: str,
    prepared: dict[str, Any],
    trained: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    output = tmp_path / "predictions.json"
    evaluate.main(["--checkpoint", trained["checkpoint"], "--framework", framework,
                   "--data", prepared["heldout_path"], "--output", str(output)])  # fmt: skip
    result = parse_result(capsys.readouterr().out)
    assert result is not None
    held = pq.read_table(prepared["heldout_path"], columns=["prompt", "answer"]).to_pydict()
    expected = exact_match(Predictor.from_checkpoint(trained["checkpoint"]), held["prompt"], held["answer"])
    assert result["n"] == 200 and result["accuracy"] == pytest.approx(expected)
    assert result["accuracy"] >= 0.9 and result["correct"] == round(result["accuracy"] * 200)
    assert (result["framework"], result["trained_with"], result["step"]) == (framework, "jax", 1500)
    assert len(result["samples"]) == 5
    assert all(set(s) == {"prompt", "completion", "expected"} for s in result["samples"])
    saved = json.loads(output.read_text())
    assert len(saved["predictions"]) == 200
    assert sum(p["correct"] for p in saved["predictions"]) == result["correct"]
    assert result["samples"] == [
        {k: p[k] for k in ("prompt", "completion", "expected")} for p in saved["predictions"][:5]
    ]


def test_evaluate_refuses_a_directory_that_is_no_checkpoint(ray_local: dict[str, Any], tmp_path: Path) -> None:
    from addition.checkpoint import CheckpointError

    with pytest.raises(CheckpointError):
        evaluate.evaluate(str(tmp_path), "jax", str(tmp_path))
