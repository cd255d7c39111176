"""Generic Ray Train driver: build a JaxTrainer or TorchTrainer from a JSON spec and fit it.

    python -m tpuflow_driver.train --spec-json '<json>'
    python -m tpuflow_driver.train --spec-file PATH        (local path or gs://...)

Spec keys (required: framework, train_loop, run_name, storage_path, scaling_config):
    framework              "jax" | "torch"
    train_loop             "module:function", the train_loop_per_worker
    train_loop_config      dict passed to it
    scaling_config         ray.train.ScalingConfig kwargs, e.g. TpuSlice.scaling_config()
    run_name, storage_path RunConfig(name, storage_path); a resubmitted job with the same pair
                           resumes from the latest checkpoint in storage_path/run_name
    datasets               {"train": parquet dir, ...} -> ray.data.read_parquet
    max_failures           FailureConfig(max_failures): worker failures retried from the last checkpoint
    checkpoint_num_to_keep CheckpointConfig(num_to_keep)
    worker_env             env vars for the workers (e.g. {"JAX_PLATFORMS": "cpu"})
    torch_backend          TorchConfig backend, default "gloo"

Prints one `TPUFLOW_RESULT {json}` line at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpuflow_driver import storage
from tpuflow_driver.result import emit_result

FRAMEWORKS = ("jax", "torch")
SNAPSHOT = "checkpoint_manager_snapshot.json"  # what Ray Train v2 restores a run from
DRIVER_ENV_DEFAULTS = {
    # ray.train.report waits for the controller's poll; at the default 2 s every
    # checkpoint blocks the workers for up to a second
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    # Train's print patch tees worker prints to its logger and stdout: every line twice in the job log
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
}


class SpecError(ValueError):
    """The training spec is malformed; the message names the key."""


@dataclass(frozen=True)
class TrainSpec:
    framework: str
    train_loop: str
    run_name: str
    storage_path: str
    scaling_config: dict[str, Any]
    train_loop_config: dict[str, Any] = field(default_factory=dict)
    datasets: dict[str, str] = field(default_factory=dict)
    max_failures: int = 0
    checkpoint_num_to_keep: int | None = 2
    worker_env: dict[str, str] = field(default_factory=dict)
    torch_backend: str = "gloo"

    @classmethod
    def from_dict(cls, data: Any) -> TrainSpec:
        if not isinstance(data, dict):
            raise SpecError(f"the spec must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecError(f"unknown spec keys {unknown}; known: {sorted(names)}")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]  # fmt: skip
        missing = [k for k in required if k not in data]
        if missing:
            raise SpecError(f"missing spec keys {missing}")
        spec = cls(**data)
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise SpecError(f"framework must be one of {FRAMEWORKS}, got {self.framework!r}")
        module, sep, func = self.train_loop.partition(":")
        if not (module and sep and func):
            raise SpecError(f"train_loop must be 'module:function', got {self.train_loop!r}")
        if not self.run_name or "/" in self.run_name:
            raise SpecError(f"run_name must be a non-empty name without '/', got {self.run_name!r}")
        if not self.storage_path:
            raise SpecError("storage_path must be set (local directory or gs://...)")
        for key in ("scaling_config", "train_loop_config", "datasets", "worker_env"):
            if not isinstance(getattr(self, key), dict):
                raise SpecError(f"{key} must be an object")
        if not all(isinstance(v, str) for v in self.datasets.values()):
            raise SpecError("datasets maps names to parquet paths (strings)")
        if not all(isinstance(v, str) for v in self.worker_env.values()):
            raise SpecError("worker_env values must be strings")
        if isinstance(self.max_failures, bool) or not isinstance(self.max_failures, int) or self.max_failures < -1:
            raise SpecError(f"max_failures must be an integer >= -1 (-1: retry forever), got {self.max_failures!r}")
        if self.checkpoint_num_to_keep is not None and (
            not isinstance(self.checkpoint_num_to_keep, int) or self.checkpoint_num_to_keep < 1
        ):
            raise SpecError(
                f"checkpoint_num_to_keep must be a positive integer or null, got {self.checkpoint_num_to_keep!r}"
            )
        from ray.train import ScalingConfig

        allowed = {f.name for f in dataclasses.fields(ScalingConfig)}
        bad = sorted(set(self.scaling_config) - allowed)
        if bad:
            raise SpecError(f"scaling_config has keys ScalingConfig does not know: {bad}")
        if (
            self.framework == "torch"
            and self.scaling_config.get("use_tpu")
            and self.torch_backend not in ("gloo", "tpu_dist")
        ):
            # tpu_dist: TorchTPU, one worker per TPU core; gloo: CPU collectives on the slice's
            # hosts (a simulated slice, or CPU-side work placed on a real one).
            raise SpecError("torch on TPU hosts needs torch_backend 'tpu_dist' (TPU chips) or 'gloo' (host CPUs)")

    @property
    def run_path(self) -> str:
        return storage.join(storage.normalize(self.storage_path), self.run_name)


def load_spec(spec_json: str | None = None, spec_file: str | None = None) -> TrainSpec:
    if (spec_json is None) == (spec_file is None):
        raise SpecError("give exactly one of --spec-json and --spec-file")
    text = spec_json
    if spec_file is not None:
        text = storage.read_text(spec_file)
        if text is None:
            raise SpecError(f"spec file {spec_file} does not exist")
    try:
        data = json.loads(text or "")
    except json.JSONDecodeError as exc:
        raise SpecError(f"the spec is not valid JSON: {exc}") from None
    return TrainSpec.from_dict(data)


def import_train_loop(path: str) -> Callable[..., Any]:
    module, _, func = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"cannot import train_loop {path!r}: {exc}") from exc
    if not callable(fn):
        raise SpecError(f"train_loop {path!r} is not callable")
    return fn


def build_trainer(spec: TrainSpec) -> Any:
    import ray.data
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    loop = import_train_loop(spec.train_loop)  # before reading data: a wrong path fails fast
    fs, fs_path = storage.resolve_with_deadline(spec.storage_path)  # a stalled upload fails, never hangs
    run_config = RunConfig(
        name=spec.run_name,
        storage_path=fs_path,
        storage_filesystem=fs,
        failure_config=FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint_num_to_keep),
        worker_runtime_env={"env_vars": dict(spec.worker_env)} if spec.worker_env else None,
    )
    storage.quiet_ray_data()
    datasets = {}
    for name, path in spec.datasets.items():
        data_fs, data_path = storage.resolve(path)
        datasets[name] = ray.data.read_parquet(data_path, filesystem=data_fs)
    kwargs: dict[str, Any] = {
        "train_loop_config": spec.train_loop_config,
        "scaling_config": ScalingConfig(**spec.scaling_config),
        "run_config": run_config,
        "datasets": datasets or None,
    }
    if spec.framework == "jax":
        from ray.train.v2.jax import JaxConfig, JaxTrainer

        sc = spec.scaling_config
        jax_config = JaxConfig(use_tpu=bool(sc.get("use_tpu")), use_gpu=bool(sc.get("use_gpu")))
        return JaxTrainer(loop, jax_config=jax_config, **kwargs)
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(loop, torch_config=TorchConfig(backend=spec.torch_backend), **kwargs)


SLICE_LABEL, WORKER_LABEL = "ray.io/tpu-slice-name", "ray.io/tpu-worker-id"


class HostWatch:
    """Say in the driver log which slice lost which host while the trainer runs.

    A slice cannot run short of a host: Ray Train restarts the whole worker group (every slice) from
    the latest checkpoint. Its own error names a node id; this names the slice and TPU worker.
    """

    def __init__(self, nodes: Callable[[], list[dict[str, Any]]], interval: float = 1.0) -> None:
        self._nodes, self._interval = nodes, interval
        self._stop = threading.Event()
        self._alive = self._tpu_hosts()
        self.lost: list[tuple[str, str]] = []
        self._thread = threading.Thread(target=self._run, name="tpuflow-host-watch", daemon=True)

    def _tpu_hosts(self) -> dict[str, tuple[str, str]]:
        try:
            nodes = self._nodes()
        except Exception:  # a GCS hiccup: look again next time
            return getattr(self, "_alive", {})
        return {
            n["NodeID"]: (n["Labels"][SLICE_LABEL], n["Labels"].get(WORKER_LABEL, "?"))
            for n in nodes
            if n.get("Alive") and SLICE_LABEL in (n.get("Labels") or {})
        }

    def check(self) -> None:
        now = self._tpu_hosts()
        for node_id, (slice_name, worker) in self._alive.items():
            if node_id not in now:
                self.lost.append((slice_name, worker))
                print(f"[driver] slice {slice_name} lost its host worker {worker} (Ray node {node_id[:12]}); "
                      "Ray Train restarts every slice's workers from the latest checkpoint", flush=True)  # fmt: skip
        for node_id, (slice_name, worker) in now.items():
            if node_id not in self._alive:
                print(f"[driver] slice {slice_name} has a host worker {worker} again (Ray node {node_id[:12]})",
                      flush=True)  # fmt: skip
        self._alive = now

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.check()

    def __enter__(self) -> HostWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run(spec: TrainSpec) -> dict[str, Any]:
    for key, value in DRIVER_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    previous = storage.exists(storage.join(spec.run_path, SNAPSHOT))
    if previous:
        print(f"[driver] run {spec.run_name} already has checkpoints in {spec.run_path}; training resumes from the latest",
              flush=True)  # fmt: skip
    trainer = build_trainer(spec)
    print(f"[driver] fitting {spec.framework} run {spec.run_name} with {spec.scaling_config}", flush=True)
    import ray

    if not ray.is_initialized():
        ray.init()
    t0 = time.perf_counter()
    with HostWatch(ray.nodes) as watch:
        result = trainer.fit()
    fit_s = time.perf_counter() - t0
    if result.error is not None:
        raise result.error
    metrics = dict(result.metrics or {})
    # Checkpoint.path drops the URI scheme of remote storage; put it back
    checkpoint = storage.uri(result.checkpoint.filesystem, result.checkpoint.path) if result.checkpoint else None
    print(f"[driver] fit finished in {fit_s:.1f}s; metrics {metrics}", flush=True)
    return {
        "framework": spec.framework,
        "run_name": spec.run_name,
        "run_path": spec.run_path,
        "checkpoint": checkpoint,
        "metrics": metrics,
        "resumed": bool(metrics.get("resumed")) or previous,
        "previous_run_found": previous,
        "fit_s": round(fit_s, 2),
        "hosts_lost": [{"slice": s, "worker": w} for s, w in watch.lost],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tpuflow_driver.train", description=__doc__.split("\n")[0])
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--spec-json", help="the spec as a JSON string")
    group.add_argument("--spec-file", help="path (or gs://...) of a JSON spec")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spec = load_spec(args.spec_json, args.spec_file)
    emit_result(run(spec))


if __name__ == "__main__":
    main()
