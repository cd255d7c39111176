"""The framework-neutral training loop pieces, without Ray or a framework."""

from __future__ import annotations

from collections.abc import Iterator
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
