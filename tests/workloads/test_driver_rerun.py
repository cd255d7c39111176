"""A rerun of the same date on the session's local Ray: the driver run twice on one storage path.

resume="auto" (the default) hands back the earlier run's finished checkpoint and says so (0 steps trained,
``reused_finished``, ``resumed_from``); resume="never" trains every step again in a new run beside it,
whose checkpoints the next "auto" run then continues."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import ray.cloudpickle

# the workers cannot import this test module: ship its functions by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.slow


def _count_steps(config: dict[str, Any]) -> None:
    """A train loop as a user writes one: resume from the checkpoint's step, stop at num_steps."""
    import ray.train
    from ray.train import Checkpoint

    step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            step = int(Path(d, "step.txt").read_text())
    start = step
    while step < int(config["num_steps"]):
        step += 1
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "step.txt").write_text(str(step))
            ray.train.report({"step": step, "start_step": start}, checkpoint=Checkpoint.from_directory(tmp))


def _drive(storage: Path, capsys: pytest.CaptureFixture[str], **extra: Any) -> tuple[dict[str, Any], str]:
    from tpuflow_driver import train as driver
    from tpuflow_driver.result import parse_result

    spec = {
        "framework": "jax",
        "train_loop": f"{__name__}:_count_steps",
        "train_loop_config": {"num_steps": "3"},  # as the pipeline renders {{ params.train_steps }}
        "scaling_config": {"num_workers": 1, "use_tpu": False},
        "run_name": "jax-tpu-v6e-4x4",
        "storage_path": str(storage),
        **extra,
    }
    driver.main(["--spec-json", json.dumps(spec)])
    out = capsys.readouterr().out
    result = parse_result(out)
    assert result is not None, out[-3000:]
    return result, out


# Four fits: about 90 s on a loaded 2-core machine. make test keeps the decision's unit tests
# (tests/workloads/test_driver_spec.py) and the operator's log line (tests/rayjob/test_train_spec.py).
@pytest.mark.long
def test_a_rerun_reuses_the_finished_checkpoint_visibly_and_resume_never_trains_again(
    ray_local: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tpuflow.rayjob.workload_operators import RayTrainOperator

    first, _ = _drive(tmp_path, capsys)
    assert (first["steps_trained"], first["reused_finished"], first["resumed_from"]) == (3, False, None)
    assert first["metrics"]["step"] == 3

    # the same date again, resume auto: Ray Train restores the finished run, the loop has nothing to do
    second, log = _drive(tmp_path, capsys)
    assert second["run_name"] == "jax-tpu-v6e-4x4" and second["checkpoint"] == first["checkpoint"]
    assert (second["reused_finished"], second["resumed_from"], second["steps_trained"]) == (
        True, first["checkpoint"], 0
    )  # fmt: skip
    assert "already has checkpoints" in log and "[driver] no step trained" in log
    operator = RayTrainOperator(
        task_id="train", framework="jax", train_loop="m:f", tpu_slice={"accelerator": "TPU-V6E", "topology": "4x4"},
        storage_path=str(tmp_path), run_name="jax-tpu-v6e-4x4", cluster={"backend": "local", "name": "c"},
    )  # fmt: skip
    operator._check_result(second)  # what the task does with the job's result
    assert (
        f"reusing the finished checkpoint {first['checkpoint']} of an earlier run of this date: 0 steps trained; "
        "set Param resume=never to train again"
    ) in capsys.readouterr().out

    # resume never: every step trained again in a new run; the earlier run's checkpoints stay
    fresh, log = _drive(tmp_path, capsys, resume="never")
    assert fresh["run_name"] == "jax-tpu-v6e-4x4-fresh2"
    assert (fresh["steps_trained"], fresh["reused_finished"], fresh["resumed_from"]) == (3, False, None)
    assert (fresh["metrics"]["start_step"], fresh["metrics"]["step"]) == (0, 3)
    assert Path(fresh["checkpoint"]).parent == tmp_path / "jax-tpu-v6e-4x4-fresh2"
    assert Path(first["checkpoint"], "step.txt").read_text() == "3" and "are kept" in log

    # auto after that continues the newest run, asked for more steps: it trains them and is no reuse
    more, _ = _drive(tmp_path, capsys, train_loop_config={"num_steps": 5})
    assert (more["run_name"], more["resumed_from"], more["reused_finished"]) == (
        "jax-tpu-v6e-4x4-fresh2", fresh["checkpoint"], False
    )  # fmt: skip
    assert (more["steps_trained"], more["metrics"]["start_step"]) == (2, 3)
