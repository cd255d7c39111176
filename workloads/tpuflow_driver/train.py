"""Generic Ray Train driver: build a JaxTrainer or TorchTrainer from a JSON spec and fit it.

    python -m tpuflow_driver.train --spec-json '<json>'
    python -m tpuflow_driver.train --spec-file PATH        (local path or gs://...)

Spec keys (required: framework, train_loop, run_name, storage_path, scaling_config):
    framework              "jax" | "torch"
    train_loop             "module:function", the train_loop_per_worker
    train_loop_config      dict passed to it
    scaling_config         ray.train.ScalingConfig kwargs, e.g. TpuSlice.scaling_config()
    run_name, storage_path RunConfig(name, storage_path): the run's checkpoints live in storage_path/run_name
    resume                 "auto" (default): resume the latest run of this name under storage_path from its
                           latest checkpoint (Ray Train's own restore); "never": train from scratch in a new
                           run, run_name-fresh<N> (N = 2, 3, ...), keeping every earlier run's checkpoints
    datasets               {"train": parquet dir, ...} -> ray.data.read_parquet
    max_failures           FailureConfig(max_failures): worker failures retried from the last checkpoint
    checkpoint_num_to_keep CheckpointConfig(num_to_keep); null keeps every checkpoint
    checkpoint_score_attribute, checkpoint_score_order
                           CheckpointConfig's: the reported metric (and "max" | "min") that decides which
                           checkpoints num_to_keep keeps; the result then names the best as best_checkpoint
    worker_env             env vars for the workers (e.g. {"JAX_PLATFORMS": "cpu"}); the spec is this process's
                           command line: a secret goes in the job's runtime_env env_vars, which Ray gives the
                           workers too
    torch_backend          TorchConfig(backend): "gloo" (default; host CPUs) or "tpu_dist" (TPU chips)
    compilation_cache      true (default): jax workers keep JAX's persistent compilation cache under
                           storage_path (tpuflow_driver.compile_cache), so a retried or resumed run reads its
                           compiled programs back; a path (local or gs://): under that folder instead (the
                           pipeline gives its DAG's folder, shared by every day's run); false: no cache

Prints one `TPUFLOW_RESULT <nonce> {json}` line at the end (tpuflow_driver.result.emit_result). With resume
"auto", a run whose latest checkpoint had already finished (the fit reported no new checkpoint; a loop that
reports a `step` metric and takes `num_steps` in its config must also show step >= num_steps) is said so:
`reused_finished: true`, `steps_trained: 0`, and `resumed_from` names the checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tpuflow_driver import compile_cache, goodput, storage
from tpuflow_driver.result import emit_result

FRAMEWORKS = ("jax", "torch")
RESUME_POLICIES = ("auto", "never")
TORCH_BACKENDS = ("gloo", "tpu_dist")
SCORE_ORDERS = ("max", "min")
FRESH = "-fresh"  # run_name-fresh2, -fresh3, ...: the runs resume="never" starts
MAX_RUNS = 1000  # of one name under one storage path: past it, a mistake (and an endless probe)
SNAPSHOT = "checkpoint_manager_snapshot.json"  # what Ray Train v2 restores a run from
DRIVER_ENV_DEFAULTS = {
    # ray.train.report waits for the controller's poll; at the default 2 s every
    # checkpoint blocks the workers for up to a second
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    # Train's print patch tees worker prints to its logger and stdout: every line twice in the job log
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # how often Ray Train looks for a drained (preempted) node: at the default 5 s a third of GKE's 15 s
    # spot notice would pass before the loop could save
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
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
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    torch_backend: str = "gloo"
    resume: str = "auto"
    compilation_cache: bool | str = True

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
        if not (isinstance(self.compilation_cache, bool) or (isinstance(self.compilation_cache, str)
                                                             and self.compilation_cache.strip())):  # fmt: skip
            raise SpecError(f"compilation_cache must be true, false or a folder, got {self.compilation_cache!r}")
        self._validate_ray_train_options()
        from ray.train import ScalingConfig

        allowed = {f.name for f in dataclasses.fields(ScalingConfig)}
        bad = sorted(set(self.scaling_config) - allowed)
        if bad:
            raise SpecError(f"scaling_config has keys ScalingConfig does not know: {bad}")

    def _validate_ray_train_options(self) -> None:
        """resume and what becomes CheckpointConfig / TorchConfig: what Ray would reject only once fitting."""
        if self.resume not in RESUME_POLICIES:
            raise SpecError(f"resume must be one of {RESUME_POLICIES}, got {self.resume!r}")
        if FRESH in self.run_name and self.run_name.rpartition(FRESH)[2].isdigit():
            raise SpecError(f"run_name must not end in '{FRESH}<N>' (the names resume='never' gives), got "
                            f"{self.run_name!r}")  # fmt: skip
        attribute, order = self.checkpoint_score_attribute, self.checkpoint_score_order
        if attribute is not None and not (isinstance(attribute, str) and attribute.strip()):
            raise SpecError(f"checkpoint_score_attribute must be a reported metric's name or null, got {attribute!r}")
        if order is not None and order not in SCORE_ORDERS:
            raise SpecError(f"checkpoint_score_order must be one of {SCORE_ORDERS} or null, got {order!r}")
        if order is not None and attribute is None:
            raise SpecError("checkpoint_score_order needs checkpoint_score_attribute (the metric it orders by)")
        # tpu_dist: TorchTPU, one worker per TPU chip; gloo: CPU collectives on the slice's hosts
        # (a simulated slice, or CPU-side work placed on a real one).
        if self.torch_backend not in TORCH_BACKENDS:
            raise SpecError(f"torch_backend must be one of {TORCH_BACKENDS}, got {self.torch_backend!r}")

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


def train_loop_for(spec: TrainSpec) -> Callable[..., Any]:
    """The spec's train loop, as the workers run it: a jax loop turns the compilation cache on first."""
    loop = import_train_loop(spec.train_loop)
    if spec.framework != "jax" or spec.compilation_cache is False:
        return loop
    root = spec.compilation_cache if isinstance(spec.compilation_cache, str) else spec.storage_path
    return compile_cache.wrap(loop, compile_cache.base_folder(root, spec.scaling_config))


def build_run_config(spec: TrainSpec) -> Any:
    """RunConfig with the spec's FailureConfig and CheckpointConfig, as given (Ray's defaults where unset)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig

    checkpoint = {"num_to_keep": spec.checkpoint_num_to_keep}
    if spec.checkpoint_score_attribute is not None:
        checkpoint["checkpoint_score_attribute"] = spec.checkpoint_score_attribute
    if spec.checkpoint_score_order is not None:
        checkpoint["checkpoint_score_order"] = spec.checkpoint_score_order
    fs, fs_path = storage.resolve_with_deadline(spec.storage_path)  # a stalled upload fails, never hangs
    return RunConfig(
        name=spec.run_name,
        storage_path=fs_path,
        storage_filesystem=fs,
        failure_config=FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=CheckpointConfig(**checkpoint),
        worker_runtime_env={"env_vars": dict(spec.worker_env)} if spec.worker_env else None,
    )


def build_trainer(spec: TrainSpec) -> Any:
    import ray.data
    from ray.train import ScalingConfig

    loop = train_loop_for(spec)  # before reading data: a wrong path fails fast
    run_config = build_run_config(spec)
    storage.quiet_ray_data()
    datasets = {}
    for name, path in spec.datasets.items():
        data_fs, data_path = storage.resolve_with_deadline(path)
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


@dataclass(frozen=True)
class EarlierRun:
    """A run of this name that already holds checkpoints, as Ray Train's snapshot describes it."""

    run_name: str
    checkpoint: str | None  # its latest checkpoint (what Ray Train restores), a local path or URI
    metrics: dict[str, Any]  # reported with that checkpoint


def run_names(base: str) -> Iterator[str]:
    """The names the runs of ``base`` take, in order: base, base-fresh2, base-fresh3, ..."""
    yield base
    for n in range(2, MAX_RUNS + 1):
        yield f"{base}{FRESH}{n}"


def earlier_runs(storage_path: str, base: str) -> list[str]:
    """The runs of ``base`` under storage_path that hold checkpoints, oldest first.

    resume="never" adds the next name only after the last one holds a snapshot, so the first name
    without one ends the list."""
    root, found = storage.normalize(storage_path), []
    for name in run_names(base):
        if not storage.exists(storage.join(root, name, SNAPSHOT)):
            return found
        found.append(name)
    raise SpecError(f"{MAX_RUNS} runs named {base!r} under {storage_path}: give another run_name or storage_path")


def read_earlier_run(storage_path: str, name: str) -> EarlierRun:
    """The latest checkpoint (and its metrics) in a run's snapshot; unknown when the snapshot is unreadable."""
    run_path = storage.join(storage.normalize(storage_path), name)
    try:
        latest = json.loads(storage.read_text(storage.join(run_path, SNAPSHOT)) or "{}").get("latest_checkpoint_result")
    except (json.JSONDecodeError, AttributeError):
        latest = None
    latest = latest if isinstance(latest, dict) else {}
    dir_name, metrics = latest.get("checkpoint_dir_name"), latest.get("metrics")
    checkpoint = storage.join(run_path, dir_name) if isinstance(dir_name, str) and dir_name else None
    return EarlierRun(name, checkpoint, dict(metrics) if isinstance(metrics, dict) else {})


def choose_run(base: str, resume: str, runs: list[str]) -> tuple[str, str | None]:
    """(the run to fit, the earlier run it resumes or None) given the runs of ``base`` holding checkpoints.

    "auto" continues the latest of them (Ray Train restores its latest checkpoint); "never" starts the
    next name, so no checkpoint is restored and none is deleted."""
    if resume == "never":
        return (f"{base}{FRESH}{len(runs) + 1}" if runs else base), None
    return (runs[-1], runs[-1]) if runs else (base, None)


def _whole(value: Any) -> int | None:
    """An integer metric or config value (a rendered Param may arrive as "1500"); None if it is none."""
    if isinstance(value, bool):
        return None
    try:
        return int(value) if float(value) == int(float(value)) else None
    except (TypeError, ValueError, OverflowError):
        return None


def _same_checkpoint(a: str, b: str) -> bool:
    """The same run's same checkpoint folder (Ray's path and ours may differ in scheme)."""
    return a.rstrip("/").split("/")[-2:] == b.rstrip("/").split("/")[-2:]


def reused_finished(earlier: EarlierRun | None, checkpoint_after: str | None, config: dict[str, Any]) -> bool:
    """Whether the fit only handed back the finished checkpoint of an earlier run: it reported no new
    checkpoint, and (where the loop reports `step` and takes `num_steps`) that checkpoint's step had
    reached the steps asked."""
    if earlier is None or earlier.checkpoint is None or checkpoint_after is None:
        return False
    if not _same_checkpoint(earlier.checkpoint, checkpoint_after):
        return False  # this fit reported a checkpoint of its own: it trained
    done, asked = _whole(earlier.metrics.get("step")), _whole(config.get("num_steps"))
    return done is None or asked is None or done >= asked


def steps_trained(earlier: EarlierRun | None, metrics: dict[str, Any], reused: bool) -> int | None:
    """Steps this fit added (its last `step` less the earlier run's); None where the loop reports no step."""
    if reused:
        return 0
    after = _whole(metrics.get("step"))
    before = _whole(earlier.metrics.get("step")) if earlier is not None else 0
    return None if after is None or before is None else after - before


def best_checkpoint(result: Any, spec: TrainSpec) -> str | None:
    """The kept checkpoint that scores best on checkpoint_score_attribute (None without one)."""
    if spec.checkpoint_score_attribute is None or not result.best_checkpoints:
        return None
    checkpoint = result.get_best_checkpoint(spec.checkpoint_score_attribute, spec.checkpoint_score_order or "max")
    return storage.uri(checkpoint.filesystem, checkpoint.path) if checkpoint is not None else None


def resolve_run(spec: TrainSpec) -> tuple[TrainSpec, EarlierRun | None]:
    """The spec with the run to fit, and the earlier run it resumes (said in the driver log)."""
    runs = earlier_runs(spec.storage_path, spec.run_name)
    name, resumes = choose_run(spec.run_name, spec.resume, runs)
    chosen = dataclasses.replace(spec, run_name=name)
    if resumes is not None:
        print(f"[driver] run {name} already has checkpoints in {chosen.run_path}; training resumes from the latest "
              "(resume=never trains from scratch in a new run)", flush=True)  # fmt: skip
        return chosen, read_earlier_run(spec.storage_path, resumes)
    if runs:
        print(f"[driver] resume=never: run {name} trains from scratch in {chosen.run_path}; the checkpoints of "
              f"{', '.join(runs)} are kept", flush=True)  # fmt: skip
    return chosen, None


def run(spec: TrainSpec) -> dict[str, Any]:
    for key, value in DRIVER_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    spec, earlier = resolve_run(spec)
    trainer = build_trainer(spec)
    print(f"[driver] fitting {spec.framework} run {spec.run_name} with {spec.scaling_config}", flush=True)
    import ray

    if not ray.is_initialized():
        ray.init()
    recorder = goodput.start_recorder()
    t0, fit_started_at = time.perf_counter(), time.time()
    with HostWatch(ray.nodes) as watch:
        result = trainer.fit()
    fit_s = time.perf_counter() - t0
    timeline = goodput.training_timeline(
        ray.get(recorder.records.remote()),
        fit_started_at,
        time.time(),
        hosts_lost=bool(watch.lost),
        checkpoint_every=_whole(spec.train_loop_config.get("checkpoint_every")),
    )
    ray.kill(recorder)
    if result.error is not None:
        raise result.error
    metrics = dict(result.metrics or {})
    # Checkpoint.path drops the URI scheme of remote storage; put it back
    checkpoint = storage.uri(result.checkpoint.filesystem, result.checkpoint.path) if result.checkpoint else None
    reused = reused_finished(earlier, checkpoint, spec.train_loop_config)
    print(f"[driver] fit finished in {fit_s:.1f}s; metrics {metrics}", flush=True)
    if reused:
        print(f"[driver] no step trained: the latest checkpoint {checkpoint} of run {spec.run_name} had finished "
              "training", flush=True)  # fmt: skip
    return {
        "framework": spec.framework,
        "run_name": spec.run_name,
        "run_path": spec.run_path,
        "checkpoint": checkpoint,
        "best_checkpoint": best_checkpoint(result, spec),
        "metrics": metrics,
        "resume": spec.resume,
        "resumed": bool(metrics.get("resumed")) or earlier is not None,
        "previous_run_found": earlier is not None,
        "resumed_from": earlier.checkpoint if earlier is not None else None,
        "reused_finished": reused,
        "steps_trained": steps_trained(earlier, metrics, reused),
        # what the loop evaluated after its last step, reported with the last checkpoint (None: it did not)
        "evaluation": metrics.get("evaluation") if isinstance(metrics.get("evaluation"), dict) else None,
        "fit_s": round(fit_s, 2),
        "hosts_lost": [{"slice": s, "worker": w} for s, w in watch.lost],
        # the fit's wall seconds by cause, as the loop's StepClock recorded them (none: the loop keeps none)
        "goodput": timeline,
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
