"""Checkpoint layout shared by both frameworks.

    meta.json       format, framework, step, epoch, model config, task digits
    params.npz      canonical float32 parameters (model_jax.param_shapes names)
    opt_state.npz   JAX: optax state leaves in tree-flatten order
    optimizer.pt    torch: optimizer and LR-scheduler state dicts

Inference (evaluate, serve) needs only meta.json and params.npz, so a checkpoint from
either framework serves without importing jax or torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from addition.data import TaskSpec
from addition.model_jax import ModelConfig, param_shapes

FORMAT = "tpuflow-addition/1"
META, PARAMS, OPT_STATE, TORCH_OPT = "meta.json", "params.npz", "opt_state.npz", "optimizer.pt"


class CheckpointError(ValueError):
    """Not a checkpoint of this workload, or one that does not match the model."""


@dataclass(frozen=True)
class Meta:
    framework: str
    step: int
    epoch: int
    model: ModelConfig
    task: TaskSpec

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "framework": self.framework,
            "step": self.step,
            "epoch": self.epoch,
            "model": self.model.to_dict(),
            "task": {"digits": self.task.digits},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Meta:
        if data.get("format") != FORMAT:
            raise CheckpointError(f"unknown checkpoint format {data.get('format')!r}, expected {FORMAT!r}")
        return cls(
            framework=str(data["framework"]),
            step=int(data["step"]),
            epoch=int(data.get("epoch", 0)),
            model=ModelConfig.from_dict(data["model"]),
            task=TaskSpec(int(data["task"]["digits"])),
        )


def save(
    directory: str | Path, meta: Meta, params: dict[str, np.ndarray], opt_leaves: list[np.ndarray] | None = None
) -> None:
    """params.npz (and, given ``opt_leaves``, opt_state.npz), then meta.json, each fsync'd with the folder: on
    disk, not in the page cache, when it returns (a preempted VM takes its page cache with it)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    np.savez(d / PARAMS, **{k: np.asarray(v, dtype=np.float32) for k, v in params.items()})
    if opt_leaves is not None:
        save_leaves(d / OPT_STATE, opt_leaves)
    (d / META).write_text(json.dumps(meta.to_dict(), indent=2))
    for name in (PARAMS, *((OPT_STATE,) if opt_leaves is not None else ()), META):
        _fsync(d / name)
    _fsync(d)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_meta(directory: str | Path) -> Meta:
    path = Path(directory) / META
    if not path.exists():
        raise CheckpointError(f"{directory} has no {META}; not a checkpoint of this workload")
    return Meta.from_dict(json.loads(path.read_text()))


def load_resumable_meta(directory: str | Path, framework: str, model: ModelConfig) -> Meta:
    """The checkpoint's Meta, refused unless a ``framework`` training of ``model`` can resume from it."""
    meta = load_meta(directory)
    if meta.framework != framework:
        shown = "JAX" if framework == "jax" else framework
        raise CheckpointError(f"cannot resume {shown} training from a {meta.framework} checkpoint")
    if meta.model != model:
        raise CheckpointError(f"checkpoint model {meta.model} differs from the configured {model}")
    return meta


def load_params(directory: str | Path, cfg: ModelConfig) -> dict[str, np.ndarray]:
    with np.load(Path(directory) / PARAMS) as npz:
        params = {k: npz[k] for k in npz.files}
    expected = param_shapes(cfg)
    got = {k: tuple(v.shape) for k, v in params.items()}
    if got != expected:
        missing, extra = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
        wrong = sorted(k for k in expected.keys() & got.keys() if expected[k] != got[k])
        raise CheckpointError(
            f"parameters do not match the model config: missing {missing}, extra {extra}, shape {wrong}"
        )
    return params


def _leaf_arrays(leaves: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {f"leaf_{i:04d}": np.asarray(x) for i, x in enumerate(leaves)}


def save_leaves(path: str | Path, leaves: list[np.ndarray]) -> None:
    np.savez(path, **_leaf_arrays(leaves))


def load_leaves(path: str | Path) -> list[np.ndarray]:
    with np.load(path) as npz:
        return [npz[k] for k in sorted(npz.files)]


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[Path]:
    """A local directory holding the checkpoint at `path` (local, or a URI such as gs://...)."""
    if "://" not in path:
        yield Path(os.path.abspath(path))
        return
    from ray.train import Checkpoint
    from tpuflow_driver import storage

    fs, fs_path = storage.resolve_with_deadline(path)  # STORAGE_EMULATOR_HOST; a stalled call fails
    with tempfile.TemporaryDirectory(prefix="tpuflow-ckpt-") as tmp:
        Checkpoint(path=fs_path, filesystem=fs).to_directory(tmp)
        yield Path(tmp)
