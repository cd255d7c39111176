"""The driver's persistent compilation cache: two fresh processes of the demo's jax training share it, keyed
by version; off, nothing is written. And the checkpoint files the driver writes read back bit-exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("optax")
WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"

TRAIN = """
import json, sys
from tpuflow_driver import compile_cache
from tpuflow_driver.goodput import StepClock
from addition.data import generate
from addition.model_jax import init_params
from addition.train_jax import DataParallelState
from addition.training import fit, model_config, resolve_config

def loop(config):
    cfg = resolve_config(config)
    state = DataParallelState(cfg, init_params(model_config(cfg)[1], 0))
    rows = generate("2026-01-01", "train", 64, num_heldout=200)["tokens"]
    clock = StepClock()
    fit(state.step, state.fetch_float, cfg, lambda _e: (state.global_batch(rows[i * 32:(i + 1) * 32]) for i in range(2)),
        clock=clock, log=lambda _m: None)
    print(json.dumps({"compile_s": clock.seconds["compile"]}))

base = sys.argv[1]
run = compile_cache.wrap(loop, base) if base != "off" else loop
run({"num_steps": 2, "global_batch_size": 32})
"""


def train(base: str) -> dict:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(WORKLOADS),
        "TPUFLOW_COMPILATION_CACHE_MIN_COMPILE_S": "0",
    }
    done = subprocess.run([sys.executable, "-c", TRAIN, base], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_fresh_runs_share_the_cache_keyed_by_version(tmp_path: Path) -> None:
    from tpuflow_driver import compile_cache

    base = compile_cache.base_folder(str(tmp_path / "storage"), {"num_workers": 1})
    cold = train(base)
    folder = Path(base) / compile_cache.version_key()
    entries = sorted(p.name for p in folder.iterdir())
    assert entries, "the first run wrote no compiled program"
    import jax

    assert f"jax-{jax.__version__}" in folder.name and "jaxlib-" in folder.name and "libtpu-" in folder.name
    warm = train(base)
    assert sorted(p.name for p in folder.iterdir()) == entries  # the second run read them, compiled nothing new
    print(f"compile cause: cold {cold['compile_s']:.2f} s, warm {warm['compile_s']:.2f} s")


def test_off_leaves_no_cache(tmp_path: Path) -> None:
    from tpuflow_driver import train as driver

    spec = driver.TrainSpec(framework="jax", train_loop="addition.train_jax:train_loop_per_worker", run_name="r",
                            storage_path=str(tmp_path), scaling_config={}, compilation_cache=False)  # fmt: skip
    assert driver.train_loop_for(spec) is driver.import_train_loop(spec.train_loop)
    train("off")
    assert not any(tmp_path.rglob("*"))


def test_spec_wraps_a_jax_loop_under_the_storage_or_the_given_folder(tmp_path: Path) -> None:
    from tpuflow_driver import compile_cache
    from tpuflow_driver import train as driver

    spec = driver.TrainSpec(framework="jax", train_loop="addition.train_jax:train_loop_per_worker", run_name="r",
                            storage_path=str(tmp_path), scaling_config={"topology": "2x2", "accelerator_type": "TPU-V6E",
                                                                        "num_workers": 1})  # fmt: skip
    assert driver.train_loop_for(spec).__name__ == "loop_with_config"
    assert compile_cache.base_folder(str(tmp_path), spec.scaling_config).endswith(
        "jax-compilation-cache/TPU-V6E-2x2-1w"
    )
    with pytest.raises(driver.SpecError, match="compilation_cache"):
        driver.TrainSpec.from_dict({**spec.__dict__, "compilation_cache": ""})


def test_a_checkpoint_reads_back_bit_exact_with_its_optimizer_state(tmp_path: Path) -> None:
    from addition import checkpoint as ckpt
    from addition.data import TaskSpec
    from addition.model_jax import ModelConfig, init_params

    model = ModelConfig.from_dict(
        {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16, "seq_len": 10, "vocab_size": 14}
    )
    params = {k: np.asarray(v) for k, v in init_params(model, 0).items()}
    leaves = [np.arange(12, dtype=np.float32).reshape(3, 4).T, np.array(7, np.int32), np.zeros((0, 2))]
    ckpt.save(tmp_path / "c", ckpt.Meta("jax", 5, 1, model, TaskSpec(2)), params, leaves)
    back = ckpt.load_params(tmp_path / "c", model)
    assert all(np.array_equal(back[k], v) for k, v in params.items())
    for got, want in zip(ckpt.load_leaves(tmp_path / "c" / ckpt.OPT_STATE), leaves, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
    assert ckpt.load_meta(tmp_path / "c").step == 5
