"""Framework-neutral training pieces: the config, the step/epoch loop, the metrics reported."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from addition.data import TaskSpec
from addition.model_jax import ModelConfig
from tpuflow_driver.goodput import StepClock
from tpuflow_driver.preemption import PreemptionNotice

DEFAULTS: dict[str, Any] = {
    "num_steps": 1500,
    "global_batch_size": 128,
    "learning_rate": 6e-3,
    "warmup_steps": 100,
    # Cosine decay all the way down: ending at 10% of the peak left the last steps noisy
    # enough that held-out exact match swung between 0.86 and 0.98 across dates and seeds.
    "final_lr_fraction": 0.0,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "optimizer": "adamw",  # or "sgd"
    "checkpoint_every": 500,
    # steps between looks at Ray Train's preemption notice; 0: never look. A look is a barrier of the workers
    # (about 5 ms here): every step would add 40 % to this model's 11 ms step (bench preemption_check_overhead),
    # every 25 steps is 0.3 s late against a notice of 15 s or more
    "preemption_check_every": 25,
    "log_every": 100,
    "seed": 0,
    "digits": 2,
    "shuffle_buffer": 2048,  # rows; 0 turns Ray Data's local shuffle off
    "cache_rows": 1_000_000,  # replay a worker's shard from memory after the first pass if it has at most this many rows
    "torch_threads": 0,  # 0: the node's CPUs divided by the workers on it
    "model": {},  # ModelConfig fields: d_model, n_heads, n_layers, d_ff
    # parquet set (prep's heldout) the workers answer after the last step, reported with the last checkpoint as
    # the metric "evaluation" (addition.heldout); None: no evaluation in training
    "heldout": None,
}


def resolve_config(config: dict[str, Any] | None) -> dict[str, Any]:
    unknown = set(config or {}) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown train_loop_config keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **(config or {})}
    for key in ("num_steps", "global_batch_size", "checkpoint_every", "log_every"):
        if int(cfg[key]) < 1:
            raise ValueError(f"{key} must be >= 1, got {cfg[key]}")
    if int(cfg["preemption_check_every"]) < 0:
        raise ValueError(f"preemption_check_every must be >= 0 (0: never), got {cfg['preemption_check_every']}")
    if not 0.0 <= float(cfg["final_lr_fraction"]) <= 1.0:
        raise ValueError(f"final_lr_fraction must be between 0 and 1, got {cfg['final_lr_fraction']}")
    if cfg["optimizer"] not in ("adamw", "sgd"):
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {cfg['optimizer']!r}")
    model_config(cfg)  # validates digits and model fields
    return cfg


def model_config(cfg: dict[str, Any]) -> tuple[TaskSpec, ModelConfig]:
    spec = TaskSpec(int(cfg["digits"]))
    unknown = set(cfg["model"]) - set(ModelConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown model keys {sorted(unknown)}")
    return spec, ModelConfig.from_dict({**cfg["model"], "seq_len": spec.seq_len})


def fit(
    step_fn: Callable[[Any], Any],
    fetch: Callable[[Any], float],
    cfg: dict[str, Any],
    epoch_batches: Callable[[int], Iterable[Any]],
    *,
    step: int = 0,
    epoch: int = 0,
    on_checkpoint: Callable[[int, int, float], None] | None = None,
    notice: PreemptionNotice | None = None,
    clock: StepClock | None = None,
    log: Callable[[str], None] = print,
    prefetch: Callable[[Any], Any] | None = None,
) -> tuple[int, int, float]:
    """Run steps until num_steps; returns (step, epoch of the last step, last loss). One epoch = one pass over the data.

    step_fn returns the loss as a device value; it is fetched (a host sync) only when logged
    or checkpointed. A logged loss is read after the next step is dispatched, so the device has that step
    to run while the host waits for the value (a sync right after the step left the chip idle: 1-1.5 % of a
    0.45 ms step on a TPU v5e, bench device_train_step_ratio). With a preemption notice
    (tpuflow_driver.preemption), the step the notice arrives at is checkpointed and no further step is taken
    until the reclaim. ``clock`` (default: one that reports nowhere) is charged with where the time went
    (tpuflow_driver.goodput). ``prefetch`` starts a logged loss's copy to the host as soon as its step is
    dispatched and returns what ``fetch`` then reads: the read a step later finds the value there (on a TPU v5e
    the read took 0.45 ms, a step of the demo's, and 0.08 ms prefetched).
    """
    num_steps, log_every, ckpt_every = int(cfg["num_steps"]), int(cfg["log_every"]), int(cfg["checkpoint_every"])
    clock = clock or StepClock()
    clock.begin(step)
    loss_value = float("nan")
    t_log, s_log = time.perf_counter(), step
    unread: tuple[Any, str] | None = None  # a logged step's loss and its line, read once the next step is dispatched

    def log_step(loss: Any, line: str) -> float:
        value = fetch(loss)
        log(line.format(loss=value))
        return value

    while step < num_steps:
        batches = 0
        for batch in epoch_batches(epoch):
            clock.mark("data_wait")
            loss = step_fn(batch)
            step += 1
            batches += 1
            if unread is not None:
                loss_value, unread = log_step(*unread), None
            logged = step % log_every == 0 or step == num_steps
            checkpointed = on_checkpoint is not None and (step % ckpt_every == 0 or step == num_steps)
            if logged:
                now = time.perf_counter()
                line = f"step {step}/{num_steps} epoch {epoch} loss {{loss:.4f}} "
                line += f"({(now - t_log) / max(step - s_log, 1) * 1000:.1f} ms/step)"
                t_log, s_log = now, step
                if checkpointed or step == num_steps:
                    loss_value = log_step(loss, line)
                else:
                    unread = (prefetch(loss) if prefetch is not None else loss, line)
            elif checkpointed:
                loss_value = fetch(loss)
            clock.step(step)
            if checkpointed:
                assert on_checkpoint is not None
                on_checkpoint(step, epoch, loss_value)
                clock.mark("checkpoint")
            if step >= num_steps:
                break
            if notice is None or on_checkpoint is None:
                continue
            arrived = notice.arrived()
            clock.mark(clock.step_cause)  # a look at the notice is part of the step
            if arrived:
                if unread is not None:
                    loss_value, unread = log_step(*unread), None
                if not checkpointed:
                    loss_value = fetch(loss)
                    on_checkpoint(step, epoch, loss_value)
                    clock.mark("checkpoint")
                clock.flush()  # the hold may end in the kill
                left = notice.seconds_left()
                log(
                    f"preemption notice at step {step}: checkpoint saved"
                    + (f" with {left:.0f}s to the reclaim" if left is not None else "")
                    + "; no further step until then"
                )
                notice.hold()
                clock.mark("preemption")
                log(f"still running {notice.grace_s:.0f}s past the reclaim deadline: training goes on")
        if batches == 0:
            raise RuntimeError("the training data yielded no full batch; lower global_batch_size or add data")
        if step < num_steps:
            epoch += 1
    clock.flush()
    return step, epoch, loss_value


def checkpoint_checks(
    evaluation: Callable[[int, int], dict[str, Any]],
    replicas_in_sync: Callable[[], bool | None],
    clock: StepClock,
    at_step: int,
    at_epoch: int,
    rank: int,
    who: str,
) -> tuple[dict[str, Any], bool | None]:
    """What a worker does at a checkpoint before saving it: the held-out evaluation (its time charged to the
    evaluation on ``clock``) and whether the workers' parameters still agree (a collective: every worker calls it;
    a divergence is printed as ``who``'s). Returns (the evaluation's metrics, in sync; None with one worker)."""
    evaluated = evaluation(at_step, at_epoch)
    if evaluated:
        clock.mark("evaluation")  # not a checkpoint's time: the ledger shows it as the evaluation's
    in_sync = replicas_in_sync()
    if in_sync is False:
        print(f"[{who}] ERROR: worker parameters diverged at step {at_step} (rank {rank})", flush=True)
    return evaluated, in_sync


def preemption_notice(cfg: dict[str, Any]) -> PreemptionNotice | None:
    """The notice a Ray Train loop checks (None when the config turns it off)."""
    every = int(cfg["preemption_check_every"])
    return PreemptionNotice(every=every) if every else None


def shuffle_seed(cfg: dict[str, Any], epoch: int, world: int, rank: int) -> int | None:
    """Ray Data's local shuffle seed: different per epoch and worker, reproducible per run."""
    return int(cfg["seed"]) * 1_000_003 + epoch * world + rank if int(cfg["shuffle_buffer"]) else None


class CachedEpochs:
    """Epoch 0 streams the worker's Ray Data shard and keeps a copy of the rows it sees; later
    epochs replay that copy in a fresh order without touching Ray Data again.

    Re-streaming a small parquet set costs more than the steps it feeds (every epoch starts
    read tasks and a split coordinator pass; tens of seconds on a busy 2-core machine), so
    a shard that fits in `cache_rows` is read once. Larger shards stream every epoch.
    """

    def __init__(
        self,
        stream: Callable[[int], Iterable[Any]],
        to_batch: Callable[[np.ndarray], Any],
        batch_rows: int,
        cache_rows: int,
        seed: int,
        rank: int,
        min_across_workers: Callable[[int], int],
    ):
        self._stream, self._to_batch = stream, to_batch
        self._batch_rows, self._cache_rows = batch_rows, cache_rows
        self._seed, self._rank, self._min = seed, rank, min_across_workers
        self._seen: list[np.ndarray] | None = [] if cache_rows > 0 else None
        self._seen_rows = 0
        self._rows: np.ndarray | None = None
        self._batches = 0

    def keep(self, rows: np.ndarray) -> None:
        """Called with every streamed batch (from Ray Data's collate threads: list.append is atomic)."""
        if self._seen is None:
            return
        self._seen_rows += len(rows)
        if self._seen_rows > self._cache_rows:
            self._seen = None
        else:
            self._seen.append(np.array(rows, copy=True))

    @property
    def cached(self) -> bool:
        return self._rows is not None

    def __call__(self, epoch: int) -> Iterator[Any]:
        if self._rows is None:
            yield from self._stream(epoch)
            if self._cache_rows > 0:
                rows = np.concatenate(self._seen) if self._seen else None
                # every worker calls this collective; all must agree to cache and on the step count
                # (a worker over the cap reports 0 and everyone keeps streaming)
                agreed = self._min(len(rows) // self._batch_rows if rows is not None else 0)
                if agreed > 0:
                    self._rows, self._batches = rows, agreed
            self._seen = None
            return
        order = np.random.default_rng([self._seed, epoch, self._rank]).permutation(len(self._rows))
        for i in range(self._batches):
            yield self._to_batch(self._rows[order[i * self._batch_rows : (i + 1) * self._batch_rows]])


def fingerprint(params: dict[str, np.ndarray]) -> np.ndarray:
    """A few float64 sums that differ when two copies of the parameters differ."""
    names = sorted(params)
    flat = np.concatenate([np.asarray(params[k], dtype=np.float64).ravel() for k in names])
    weights = np.arange(1, flat.size + 1, dtype=np.float64) / flat.size
    return np.array([flat.sum(), np.abs(flat).sum(), (flat * weights).sum()])


class RunMetrics:
    """The metrics every report carries (rank 0's are the ones Ray Train keeps)."""

    def __init__(self, framework: str, world_size: int, start_step: int, resumed_from: str | None):
        self.framework, self.world_size = framework, world_size
        self.start_step, self.resumed_from = start_step, resumed_from
        self.t0 = time.perf_counter()

    def __call__(self, step: int, epoch: int, loss: float, replicas_in_sync: bool | None = None) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.t0
        return {
            "framework": self.framework,
            "step": step,
            "epoch": epoch,
            "loss": loss,
            "start_step": self.start_step,
            "resumed": self.resumed_from is not None,
            "resumed_from": self.resumed_from,
            "world_size": self.world_size,
            "elapsed_s": round(elapsed, 3),
            "steps_per_s": round((step - self.start_step) / elapsed, 2) if elapsed > 0 else None,
            # every worker's parameters compared at this step (None: one worker)
            "replicas_in_sync": replicas_in_sync,
        }
