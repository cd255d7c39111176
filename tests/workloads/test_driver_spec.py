"""Spec parsing of the generic training driver (no Ray cluster needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tpuflow_driver import train as driver
from tpuflow_driver.result import emit_result, parse_result

BASE: dict[str, Any] = {
    "framework": "jax",
    "train_loop": "addition.train_jax:train_loop_per_worker",
    "run_name": "r1",
    "storage_path": "/tmp/runs",
    "scaling_config": {"use_tpu": True, "topology": "4x4", "accelerator_type": "TPU-V6E", "num_workers": 4},
}


def test_minimal_spec_gets_defaults_and_the_catalog_scaling_config() -> None:
    from tpuflow.tpu.slice import TpuSlice

    spec = driver.TrainSpec.from_dict({**BASE, "scaling_config": TpuSlice.from_spec("TPU-V6E", "4x4").scaling_config()})
    assert spec.scaling_config == BASE["scaling_config"]
    assert (spec.max_failures, spec.checkpoint_num_to_keep, spec.datasets, spec.torch_backend) == (0, 2, {}, "gloo")
    assert spec.run_path == "/tmp/runs/r1"
    assert driver.TrainSpec.from_dict({**BASE, "storage_path": "gs://b/p"}).run_path == "gs://b/p/r1"
    assert driver.import_train_loop(spec.train_loop).__name__ == "train_loop_per_worker"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"framework": "tf"}, "framework must be one of"),
        ({"train_loop": "addition.train_jax"}, "module:function"),
        ({"run_name": "a/b"}, "run_name"),
        ({"scaling_config": {"num_workers": 2, "tpu_topology": "4x4"}}, "ScalingConfig does not know"),
        ({"max_failures": "3"}, "max_failures"),
        ({"checkpoint_num_to_keep": 0}, "checkpoint_num_to_keep"),
        ({"datasets": {"train": 3}}, "datasets"),
        ({"worker_env": {"JAX_PLATFORMS": None}}, "worker_env"),
        ({"learning_rate": 0.1}, "unknown spec keys"),
        (
            {"framework": "torch", "train_loop": "addition.train_torch:train_loop_per_worker", "torch_backend": "nccl"},
            "torch_backend",
        ),
        ({"scaling_config": {"num_workers": 2}, "torch_backend": "nccl"}, "torch_backend must be one of"),
        ({"resume": "maybe"}, "resume must be one of"),
        ({"run_name": "r1-fresh2"}, "must not end in '-fresh<N>'"),
        ({"checkpoint_score_attribute": ""}, "checkpoint_score_attribute"),
        ({"checkpoint_score_attribute": "loss", "checkpoint_score_order": "best"}, "checkpoint_score_order must be"),
        ({"checkpoint_score_order": "min"}, "needs checkpoint_score_attribute"),
    ],
)
def test_bad_specs_name_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(driver.SpecError, match=message):
        driver.TrainSpec.from_dict({**BASE, **change})


def test_missing_keys_and_bad_json() -> None:
    with pytest.raises(driver.SpecError, match=r"missing spec keys \['storage_path'\]"):
        driver.TrainSpec.from_dict({k: v for k, v in BASE.items() if k != "storage_path"})
    with pytest.raises(driver.SpecError, match="not valid JSON"):
        driver.load_spec(spec_json="{framework: jax}")
    with pytest.raises(driver.SpecError, match="JSON object"):
        driver.load_spec(spec_json="[1]")
    with pytest.raises(driver.SpecError, match="cannot import"):
        driver.import_train_loop("addition.train_jax:no_such_function")


def test_spec_file_and_cli_flags(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(BASE))
    assert driver.load_spec(spec_file=str(path)) == driver.load_spec(spec_json=json.dumps(BASE))
    with pytest.raises(driver.SpecError, match="does not exist"):
        driver.load_spec(spec_file=str(tmp_path / "nope.json"))
    with pytest.raises(SystemExit):
        driver.parse_args([])
    with pytest.raises(SystemExit):
        driver.parse_args(["--spec-json", "{}", "--spec-file", str(path)])


def test_result_marker_roundtrip(capsys: pytest.CaptureFixture[str]) -> None:
    emit_result({"a": 1})
    emit_result({"accuracy": 0.95, "samples": [{"prompt": "1+1=", "completion": "2"}]})
    out = capsys.readouterr().out
    assert out.count("\n") == 2
    assert parse_result("noise\n" + out + "TPUFLOW_RESULTS not this\n") == {
        "accuracy": 0.95, "samples": [{"prompt": "1+1=", "completion": "2"}]
    }  # fmt: skip
    assert parse_result("nothing here") is None


def test_driver_side_imports_load_neither_jax_nor_torch() -> None:
    """The driver imports the train loop modules; on a TPU host a driver-side `import jax` takes the chips."""
    import subprocess
    import sys

    code = (
        "import sys; import tpuflow_driver.train, addition.train_jax, addition.train_torch, addition.serve_app, "
        "addition.evaluate, addition.prep; print(sorted({'jax', 'torch'} & set(sys.modules)))"
    )
    workloads = Path(driver.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=workloads, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ray_train_configs_reach_the_trainer_as_given() -> None:
    spec = driver.TrainSpec.from_dict(
        {**BASE, "max_failures": 3, "checkpoint_num_to_keep": None, "checkpoint_score_attribute": "loss",
         "checkpoint_score_order": "min"}
    )  # fmt: skip
    config = driver.build_run_config(spec)
    assert (config.failure_config.max_failures, config.checkpoint_config.num_to_keep) == (3, None)
    assert config.checkpoint_config.checkpoint_score_attribute == "loss"
    assert config.checkpoint_config.checkpoint_score_order == "min"
    default = driver.build_run_config(driver.TrainSpec.from_dict(BASE)).checkpoint_config
    assert (default.num_to_keep, default.checkpoint_score_attribute, default.checkpoint_score_order) == (2, None, "max")


def _snapshot(root: Path, name: str, checkpoint: str = "checkpoint_000001", **metrics: Any) -> None:
    """What Ray Train v2 leaves in a run folder once a checkpoint is reported (the fields read here)."""
    (root / name / checkpoint).mkdir(parents=True)
    state = {"latest_checkpoint_result": {"checkpoint_dir_name": checkpoint, "metrics": metrics}}
    (root / name / driver.SNAPSHOT).write_text(json.dumps(state))


def test_auto_resumes_the_latest_run_and_never_starts_the_next(tmp_path: Path) -> None:
    assert driver.earlier_runs(str(tmp_path), "r") == []
    assert driver.choose_run("r", "auto", []) == ("r", None)
    assert driver.choose_run("r", "never", []) == ("r", None)  # nothing to keep: the plain name
    _snapshot(tmp_path, "r", step=100)
    (tmp_path / "r-fresh3").mkdir()  # not a run of "r" yet: no snapshot, and after a gap
    assert driver.earlier_runs(str(tmp_path), "r") == ["r"]
    assert driver.choose_run("r", "auto", ["r"]) == ("r", "r")
    assert driver.choose_run("r", "never", ["r"]) == ("r-fresh2", None)
    _snapshot(tmp_path, "r-fresh2", step=7)
    runs = driver.earlier_runs(str(tmp_path), "r")
    assert runs == ["r", "r-fresh2"]
    assert driver.choose_run("r", "auto", runs) == ("r-fresh2", "r-fresh2")
    assert driver.choose_run("r", "never", runs) == ("r-fresh3", None)
    earlier = driver.read_earlier_run(str(tmp_path), "r-fresh2")
    assert earlier == driver.EarlierRun("r-fresh2", str(tmp_path / "r-fresh2" / "checkpoint_000001"), {"step": 7})
    (tmp_path / "r-fresh2" / driver.SNAPSHOT).write_text("not json")
    assert driver.read_earlier_run(str(tmp_path), "r-fresh2").checkpoint is None


def test_resolve_run_says_what_it_resumes_or_keeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _snapshot(tmp_path, "r1", step=5)
    spec = driver.TrainSpec.from_dict({**BASE, "storage_path": str(tmp_path)})
    chosen, earlier = driver.resolve_run(spec)
    assert chosen.run_name == "r1" and earlier is not None and earlier.metrics == {"step": 5}
    assert "run r1 already has checkpoints" in capsys.readouterr().out
    chosen, earlier = driver.resolve_run(driver.TrainSpec.from_dict({**BASE, "storage_path": str(tmp_path),
                                                                     "resume": "never"}))  # fmt: skip
    assert (chosen.run_name, earlier) == ("r1-fresh2", None)
    assert "the checkpoints of r1 are kept" in capsys.readouterr().out
    assert (tmp_path / "r1" / "checkpoint_000001").is_dir()


def test_a_fit_that_reported_no_new_checkpoint_reused_a_finished_one() -> None:
    done = driver.EarlierRun("r", "/s/r/checkpoint_000009", {"step": 1500})
    config = {"num_steps": "1500"}  # a rendered Param may be a string
    assert driver.reused_finished(done, "/s/r/checkpoint_000009/", config) is True
    assert driver.steps_trained(done, {"step": 1500}, True) == 0
    # asked for more: the loop trained on and reported a new checkpoint
    assert driver.reused_finished(done, "/s/r/checkpoint_000012", {"num_steps": 2000}) is False
    assert driver.steps_trained(done, {"step": 2000}, False) == 500
    # the same checkpoint handed back though it had not reached the steps asked: not a finished one
    assert driver.reused_finished(done, "/s/r/checkpoint_000009", {"num_steps": 2000}) is False
    # a loop without step / num_steps: no new checkpoint is the evidence
    assert driver.reused_finished(driver.EarlierRun("r", "gs://b/s/r/c1", {}), "b/s/r/c1", {}) is True
    assert driver.reused_finished(None, "/s/r/checkpoint_000001", config) is False
    assert driver.steps_trained(None, {"step": 300}, False) == 300
    assert driver.steps_trained(None, {"loss": 0.1}, False) is None


def test_the_best_checkpoint_is_ray_trains_pick_by_the_score_attribute(tmp_path: Path) -> None:
    from ray.train import Checkpoint, Result

    kept = [(Checkpoint.from_directory(str(tmp_path / f"c{i}")), {"loss": loss}) for i, loss in enumerate((3, 1, 2))]
    result = Result(metrics={"loss": 2}, checkpoint=kept[-1][0], error=None, path=str(tmp_path), best_checkpoints=kept)
    scored = {**BASE, "checkpoint_score_attribute": "loss"}
    assert driver.best_checkpoint(result, driver.TrainSpec.from_dict({**scored, "checkpoint_score_order": "min"})) == (
        str(tmp_path / "c1")
    )
    assert driver.best_checkpoint(result, driver.TrainSpec.from_dict(scored)).endswith("c0")  # Ray's default: max
    assert driver.best_checkpoint(result, driver.TrainSpec.from_dict(BASE)) is None
