"""The framework-neutral training loop pieces, without Ray or a framework."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from addition.training import CachedEpochs, fingerprint, fit, resolve_config


def _rows(n: int) -> np.ndarray:
    return np.arange(n * 2).reshape(n, 2)


class FakeShard:
    """Stands in for a Ray Data shard: yields batches and feeds the cache like the collate fn does."""

    def __init__(self, rows: np.ndarray, batch: int):
        self.rows, self.batch, self.passes = rows, batch, 0
        self.epochs: CachedEpochs | None = None

    def __call__(self, epoch: int) -> Iterator[Any]:
        self.passes += 1
        for i in range(0, len(self.rows) - self.batch + 1, self.batch):
            assert self.epochs is not None
            self.epochs.keep(self.rows[i : i + self.batch])
            yield ("streamed", self.rows[i : i + self.batch])


def _epochs(shard: FakeShard, cache_rows: int, agree: Any = lambda n: n) -> CachedEpochs:
    shard.epochs = CachedEpochs(
        shard, lambda r: ("cached", r), shard.batch, cache_rows, seed=0, rank=0, min_across_workers=agree
    )
    return shard.epochs


def test_first_epoch_streams_then_replays_from_memory() -> None:
    shard = FakeShard(_rows(10), batch=3)
    epochs = _epochs(shard, cache_rows=100)
    first = list(epochs(0))
    assert [k for k, _ in first] == ["streamed"] * 3 and epochs.cached is not False
    second, third = list(epochs(1)), list(epochs(2))
    assert shard.passes == 1 and [k for k, _ in second] == ["cached"] * 3
    seen = np.concatenate([b for _, b in first])
    for replay in (second, third):
        got = np.concatenate([b for _, b in replay])
        assert {tuple(r) for r in got} <= {tuple(r) for r in seen}
    assert not np.array_equal(np.concatenate([b for _, b in second]), np.concatenate([b for _, b in third]))


def test_over_the_cap_or_disagreeing_workers_keep_streaming() -> None:
    shard = FakeShard(_rows(10), batch=3)
    epochs = _epochs(shard, cache_rows=5)
    list(epochs(0)), list(epochs(1))
    assert shard.passes == 2 and not epochs.cached
    shard = FakeShard(_rows(10), batch=3)
    epochs = _epochs(shard, cache_rows=100, agree=lambda n: 0)  # another worker was over its cap
    list(epochs(0)), list(epochs(1))
    assert shard.passes == 2
    shard = FakeShard(_rows(10), batch=3)
    epochs = _epochs(shard, cache_rows=100, agree=lambda n: 2)  # the smallest worker has 2 batches
    list(epochs(0))
    assert len(list(epochs(1))) == 2


def test_fit_steps_checkpoints_and_stops() -> None:
    cfg = resolve_config({"num_steps": 7, "checkpoint_every": 3, "log_every": 2})
    seen: list[tuple[int, int, float]] = []
    logs: list[str] = []
    step, epoch, loss = fit(
        lambda b: float(b), float, cfg, lambda e: iter([10 * e + 1, 10 * e + 2, 10 * e + 3]),
        on_checkpoint=lambda s, e, lo: seen.append((s, e, lo)), log=logs.append,
    )  # fmt: skip
    assert (step, epoch) == (7, 2) and [s for s, _, _ in seen] == [3, 6, 7]
    assert seen[-1] == (7, 2, 21.0) and loss == 21.0
    assert [line.split()[1] for line in logs] == ["2/7", "4/7", "6/7", "7/7"]
    # resuming at step 6 runs only the last step
    assert fit(lambda b: 0.0, float, cfg, lambda e: iter([1, 2]), step=6, epoch=4)[:2] == (7, 4)
    with pytest.raises(RuntimeError, match="no full batch"):
        fit(lambda b: 0.0, float, cfg, lambda e: iter([]))


def test_a_logged_loss_is_read_once_the_next_step_is_dispatched() -> None:
    """Reading a loss waits for its step on the device; read after the next step is dispatched, the device has that
    step to run meanwhile. The last step's loss and a checkpointed step's are read at once (they are needed)."""
    cfg = resolve_config({"num_steps": 5, "checkpoint_every": 3, "log_every": 2})
    events: list[str] = []

    def step_fn(batch: int) -> int:
        events.append(f"step {batch}")
        return batch

    def fetch(loss: int) -> float:
        events.append(f"read {loss}")
        return float(loss)

    fit(step_fn, fetch, cfg, lambda e: iter(range(1, 6)), on_checkpoint=lambda *a: events.append("save"),
        log=lambda line: events.append(line.split(" epoch")[0]))  # fmt: skip
    assert events == [
        "step 1", "step 2", "step 3", "read 2", "step 2/5", "read 3", "save",  # 2 logged, read after 3; 3 saved
        "step 4", "step 5", "read 4", "step 4/5", "read 5", "step 5/5", "save",  # the last step: read at once
    ]  # fmt: skip


def test_a_deferred_read_takes_the_prefetched_copy() -> None:
    """With prefetch, a logged loss's copy to the host starts the moment its step is dispatched, and the deferred
    read takes that copy (a read that waited for the copy cost ~0.45 ms on a TPU v5e, ~0.08 ms prefetched); a loss
    read at once (the last step, a checkpoint) is not prefetched."""
    cfg = resolve_config({"num_steps": 5, "checkpoint_every": 3, "log_every": 2})
    events: list[str] = []

    def step_fn(batch: int) -> int:
        events.append(f"step {batch}")
        return batch

    def prefetch(loss: int) -> str:
        events.append(f"copy {loss}")
        return f"host {loss}"

    def fetch(loss: int | str) -> float:
        events.append(f"read {loss}")
        return float(str(loss).split()[-1])

    fit(step_fn, fetch, cfg, lambda e: iter(range(1, 6)), log=lambda line: events.append(line.split(" epoch")[0]),
        prefetch=prefetch)  # fmt: skip
    assert events == [
        "step 1", "step 2", "copy 2", "step 3", "read host 2", "step 2/5",
        "step 4", "copy 4", "step 5", "read host 4", "step 4/5", "read 5", "step 5/5",
    ]  # fmt: skip


def test_the_jax_states_prefetch_reads_back_the_same_value() -> None:
    from addition.train_jax import DataParallelState

    jnp = pytest.importorskip("jax.numpy")
    value = jnp.arange(4.0).sum()
    assert DataParallelState.fetch(DataParallelState.prefetch(value)) == DataParallelState.fetch(value) == 6.0


def test_config_validation_and_fingerprint() -> None:
    with pytest.raises(ValueError, match="unknown model keys"):
        resolve_config({"model": {"width": 3}})
    with pytest.raises(ValueError, match="optimizer"):
        resolve_config({"optimizer": "lion"})
    with pytest.raises(ValueError, match="num_steps"):
        resolve_config({"num_steps": 0})
    a = {"w": np.ones((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    b = {"w": np.ones((2, 2), np.float32), "b": np.array([0, 0, 1e-6], np.float32)}
    swapped = {"w": np.array([[1, 1], [1, 1]], np.float32), "b": np.zeros(3, np.float32)}
    assert np.array_equal(fingerprint(a), fingerprint(swapped))
    assert not np.array_equal(fingerprint(a), fingerprint(b))


class Clock:
    """A fake clock that sleeping advances."""

    def __init__(self, now: float = 1000.0):
        self.now, self.slept = now, 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def _notice(at_call: int | None, every: int = 1, deadline_in: float | None = 30.0):
    from tpuflow_driver.preemption import PreemptionNotice

    clock = Clock()
    calls: list[int] = []

    def get_info():
        calls.append(1)
        if at_call is None or len(calls) < at_call:
            return None
        deadline = None if deadline_in is None else int((clock.now + deadline_in) * 1000)
        return SimpleNamespace(deadline_ms=deadline, preempted_node_to_ranks={"n1": [2, 3]})

    notice = PreemptionNotice(every=every, grace_s=60.0, get_info=get_info, sleep=clock.sleep, clock=clock)
    return notice, calls, clock


def test_a_notice_checkpoints_its_step_and_takes_no_further_step_until_the_reclaim() -> None:
    cfg = resolve_config({"num_steps": 20, "checkpoint_every": 10, "log_every": 100})
    notice, calls, clock = _notice(at_call=4)
    stepped: list[int] = []
    saved: list[int] = []
    logs: list[str] = []

    def step_fn(batch: int) -> float:
        stepped.append(batch)
        return float(batch)

    fit(step_fn, float, cfg, lambda e: iter(range(100)), on_checkpoint=lambda s, e, lo: saved.append(s),
        notice=notice, log=logs.append)  # fmt: skip
    # the notice arrived at step 4: saved there, then held for the notice and the grace (no reclaim came)
    assert saved[0] == 4 and clock.slept == pytest.approx(30.0 + 60.0)
    assert any("preemption notice at step 4: checkpoint saved with 30s to the reclaim" in line for line in logs)
    # asked once per step until it arrived, then never again (every worker makes the same calls)
    assert len(calls) == 4 and saved == [4, 10, 20] and len(stepped) == 20


def test_a_notice_on_a_checkpoint_step_saves_once_and_checks_follow_every() -> None:
    cfg = resolve_config({"num_steps": 12, "checkpoint_every": 6, "log_every": 100})
    notice, calls, _ = _notice(at_call=3, every=2)
    saved: list[int] = []
    fit(lambda b: 0.0, float, cfg, lambda e: iter(range(100)), on_checkpoint=lambda s, e, lo: saved.append(s),
        notice=notice, log=lambda m: None)  # fmt: skip
    assert saved == [6, 12] and len(calls) == 3  # asked at steps 2, 4 and 6; the notice found step 6 saved


def test_no_notice_no_hold_and_a_deadline_less_notice_waits_rays_default() -> None:
    cfg = resolve_config({"num_steps": 5, "checkpoint_every": 5})
    notice, calls, clock = _notice(at_call=None)
    fit(lambda b: 0.0, float, cfg, lambda e: iter(range(10)), on_checkpoint=lambda *a: None, notice=notice,
        log=lambda m: None)  # fmt: skip
    assert len(calls) == 4 and clock.slept == 0  # steps 1-4: the last step ends training, no look needed
    notice, _, clock = _notice(at_call=1, deadline_in=None)
    assert notice.arrived() and notice.seconds_left() is None and not notice.arrived()
    notice.hold()
    assert clock.slept == pytest.approx(120.0 + 60.0)
    with pytest.raises(ValueError, match="preemption_check_every"):
        resolve_config({"preemption_check_every": -1})


def test_fit_charges_each_second_to_its_cause_and_the_notice_hold_to_preemption() -> None:
    from tpuflow_driver.goodput import StepClock

    cfg = resolve_config({"num_steps": 8, "checkpoint_every": 4, "log_every": 100})
    notice, _, time_ = _notice(at_call=6, deadline_in=10.0)
    sent: list[dict[str, Any]] = []
    clock = StepClock(send=lambda key, record: sent.append(record), redo_until=2, clock=time_, flush_s=1e9)
    time_.now += 5.0  # the worker's setup before fit: restoring the checkpoint of step 1

    def batches(epoch: int) -> Iterator[int]:
        for i in range(100):
            time_.now += 0.5  # the data
            yield i

    def step_fn(batch: int) -> float:
        time_.now += 2.0 if batch == 0 else 1.0  # the first step compiles
        return 0.0

    def save(step: int, epoch: int, loss: float) -> None:
        time_.now += 3.0

    fit(step_fn, float, cfg, batches, step=1, on_checkpoint=save, notice=notice, clock=clock, log=lambda m: None)
    assert len(sent) == 2  # flushed before the hold (the kill would come inside it), and at the end
    record = sent[0]
    assert record["start_step"] == 1 and record["step"] == 7
    # step 2 (the earlier attempt had reached it) compiled: a restarted worker's first step compiles whatever it is
    assert record["steps"] == {"compile": 1, "productive": 5}
    assert record["seconds"]["restore"] == pytest.approx(5.0)
    assert record["seconds"]["compile"] == pytest.approx(2.0)
    assert record["seconds"]["productive"] == pytest.approx(5.0)
    assert record["seconds"]["data_wait"] == pytest.approx(6 * 0.5)
    assert record["seconds"]["checkpoint"] == pytest.approx(2 * 3.0)  # step 5 (periodic) and step 7 (the notice)
    # no reclaim came: the hold (what the save left of the 10 s notice, then 60 s of grace) is preemption, and
    # training went on to step 8
    assert clock.seconds["preemption"] == pytest.approx(10.0 - 3.0 + 60.0) and clock.step_no == 8


def test_steps_an_earlier_attempt_reached_are_redone() -> None:
    from tpuflow_driver.goodput import StepClock

    cfg = resolve_config({"num_steps": 10, "checkpoint_every": 100, "log_every": 100})
    clock = StepClock(redo_until=7)
    fit(lambda b: 0.0, float, cfg, lambda e: iter(range(100)), step=4, clock=clock, log=lambda m: None)
    # step 5 compiles (a restarted worker compiles again), 6 and 7 repeat the earlier attempt, 8-10 are new
    assert dict(clock.steps) == {"compile": 1, "redone": 2, "productive": 3}
