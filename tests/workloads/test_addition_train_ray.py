"""Ray Train runs on the session's local Ray: gradient averaging across workers, and the
generic driver training, checkpointing and resuming with JAX and torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray.cloudpickle
from addition import data
from addition.model_jax import init_params
from addition.training import model_config, resolve_config

# the workers cannot import this test module: ship its functions by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SGD = {"optimizer": "sgd", "learning_rate": 0.5, "global_batch_size": 32, "seed": 5}


def _one_step_per_worker(config: dict[str, Any]) -> None:
    import jax
    import ray.train
    from addition import train_jax

    cfg = resolve_config(config["train"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    joined = train_jax.ensure_jax_distributed(world, rank)
    try:
        state = train_jax.DataParallelState(cfg, init_params(model_config(cfg)[1], int(cfg["seed"])))
        tokens = np.asarray(config["tokens"], dtype=np.int32)
        per = len(tokens) // world
        loss = state.step(state.global_batch(tokens[rank * per : (rank + 1) * per]))
        out = Path(config["out"])
        np.savez(out / f"params_rank{rank}.npz", **state.params_numpy())
        info = {"processes": jax.process_count(), "devices": jax.device_count(), "loss": float(state.fetch(loss))}
        (out / f"info_rank{rank}.json").write_text(json.dumps(info))
    finally:
        if joined:
            jax.distributed.shutdown()


def _single_process_update(tokens: np.ndarray) -> dict[str, np.ndarray]:
    from addition import train_jax

    cfg = resolve_config({**SGD, "global_batch_size": len(tokens)})
    state = train_jax.DataParallelState(cfg, init_params(model_config(cfg)[1], int(cfg["seed"])))
    state.step(state.global_batch(tokens))
    return state.params_numpy()


def test_gradients_are_averaged_across_two_jax_workers(ray_local: dict[str, Any], tmp_path: Path) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxTrainer

    tokens = data.generate("2026-02-02", "train", SGD["global_batch_size"], num_heldout=200)["tokens"]
    trainer = JaxTrainer(
        _one_step_per_worker,
        train_loop_config={"train": SGD, "tokens": tokens.tolist(), "out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2, use_tpu=False),
        run_config=RunConfig(
            name="grad-avg",
            storage_path=str(tmp_path / "runs"),
            worker_runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},
        ),  # fmt: skip
    )
    trainer.fit()
    infos = [json.loads((tmp_path / f"info_rank{r}.json").read_text()) for r in range(2)]
    assert [(i["processes"], i["devices"]) for i in infos] == [(2, 2), (2, 2)]
    ranks = [dict(np.load(tmp_path / f"params_rank{r}.npz")) for r in range(2)]

    expected = _single_process_update(tokens)
    initial = init_params(model_config(resolve_config(SGD))[1], SGD["seed"])
    half = _single_process_update(tokens[: len(tokens) // 2])
    for name in expected:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=f"{name} differs between workers")
        np.testing.assert_allclose(ranks[0][name], expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # the check can tell an averaged update from a summed one and from one worker's own update
    summed = {k: initial[k] + 2 * (expected[k] - initial[k]) for k in expected}
    assert any(not np.allclose(ranks[0][k], summed[k], rtol=1e-4, atol=1e-6) for k in expected)
    assert any(not np.allclose(ranks[0][k], half[k], rtol=1e-4, atol=1e-6) for k in expected)


def _spec(framework: str, prepared: dict[str, Any], storage: Path, run_name: str, **loop: Any) -> dict[str, Any]:
    return {
        "framework": framework,
        "train_loop": f"addition.train_{framework}:train_loop_per_worker",
        "train_loop_config": {"log_every": 50, **loop},
        "scaling_config": {"num_workers": 2, "use_tpu": False},
        "run_name": run_name,
        "storage_path": str(storage),
        "datasets": {"train": prepared["train_path"]},
        "checkpoint_num_to_keep": 2,
        "worker_env": {"JAX_PLATFORMS": "cpu"},
    }


def _drive(spec: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    from tpuflow_driver import train as driver
    from tpuflow_driver.result import parse_result

    driver.main(["--spec-json", json.dumps(spec)])
    result = parse_result(capsys.readouterr().out)
    assert result is not None, "the driver printed no TPUFLOW_RESULT line"
    return result


def _checkpoint_step(path: str) -> int:
    from addition import checkpoint as ckpt

    return ckpt.load_meta(path).step


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.mark.long  # make test: the preemption drill (tests/rayjob) resumes JaxTrainer from its checkpoint
def test_driver_jax_trains_checkpoints_and_resumes(
    ray_local: dict[str, Any], prepared: dict[str, Any], runs_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _drive(_spec("jax", prepared, runs_dir, "jax-demo", num_steps=120, checkpoint_every=60), capsys)
    m = first["metrics"]
    assert (m["step"], m["start_step"], m["resumed"], m["world_size"]) == (120, 0, False, 2)
    assert m["replicas_in_sync"] is True and m["loss"] < 2.0
    assert first["resumed"] is False and first["previous_run_found"] is False
    assert _checkpoint_step(first["checkpoint"]) == 120

    # the same run name again, asked to go further: continues from the stored step-120 checkpoint
    second = _drive(_spec("jax", prepared, runs_dir, "jax-demo", num_steps=150, checkpoint_every=15), capsys)
    m = second["metrics"]
    assert second["resumed"] is True and second["previous_run_found"] is True
    assert (m["start_step"], m["step"], m["resumed_from"]) == (120, 150, first["checkpoint"])
    assert m["replicas_in_sync"] is True
    assert _checkpoint_step(second["checkpoint"]) == 150
    kept = [p for p in (runs_dir / "jax-demo").iterdir() if p.is_dir() and p.name.startswith("checkpoint")]
    assert len(kept) == 2  # checkpoint_num_to_keep


def _torch_crash_once(config: dict[str, Any]) -> None:
    """The real torch loop, but the first attempt dies after `crash_after` steps like a preempted host."""
    import ray.train
    from addition import train_torch

    config = dict(config)
    marker, crash_after = Path(config.pop("crash_marker")), int(config.pop("crash_after"))
    if marker.exists():
        train_torch.train_loop_per_worker(config)
        return
    train_torch.train_loop_per_worker({**config, "num_steps": crash_after})
    if ray.train.get_context().get_world_rank() == 0:
        marker.touch()
    raise RuntimeError("simulated preemption")


@pytest.mark.long  # make test: seed 004's TorchTrainer on Ray's TPU path (tests/workloads/test_seed_torch_tpu.py)
def test_driver_torch_trains_and_resumes_after_a_worker_failure(
    ray_local: dict[str, Any], prepared: dict[str, Any], runs_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from addition import checkpoint as ckpt

    spec = _spec("torch", prepared, runs_dir, "torch-demo", num_steps=60, checkpoint_every=20,
                 crash_marker=str(runs_dir / "torch-crashed"), crash_after=40)  # fmt: skip
    spec |= {"train_loop": f"{__name__}:_torch_crash_once", "max_failures": 1}
    result = _drive(spec, capsys)
    m = result["metrics"]
    assert (runs_dir / "torch-crashed").exists()
    # FailureConfig restarted the workers, which resumed from the step-40 checkpoint of this run
    assert (m["framework"], m["world_size"], m["start_step"], m["step"]) == ("torch", 2, 40, 60)
    assert m["resumed"] is True and result["previous_run_found"] is False
    assert m["replicas_in_sync"] is True
    assert ckpt.load_meta(result["checkpoint"]).framework == "torch" and _checkpoint_step(result["checkpoint"]) == 60
    assert (Path(result["checkpoint"]) / ckpt.TORCH_OPT).exists()
