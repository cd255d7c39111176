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
