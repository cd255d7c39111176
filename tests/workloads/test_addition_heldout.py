"""The held-out evaluation the training workers run after the last step (addition.heldout): each worker
answers its own rows, the counts are summed across them, and the result is the whole set's exact match."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from addition import data
from addition.heldout import evaluate_on_workers, heldout_rows
from addition.inference import Predictor, exact_match


def _write_heldout(folder: Path, date: str, n: int, files: int = 3) -> Path:
    """The prep step's held-out rows, in several files written out of problem_id order."""
    rows = data.generate(date, "heldout", n, num_heldout=n)
    table = pa.table({k: list(rows[k]) for k in ("problem_id", "prompt", "answer")})
    folder.mkdir()
    order = np.random.default_rng(0).permutation(n)
    for i, part in enumerate(np.array_split(order, files)):
        pq.write_table(table.take(pa.array(part)), folder / f"part-{i}.parquet")
    return folder


def test_the_workers_shares_cover_every_row_once_whatever_the_sets_size(tmp_path: Path) -> None:
    heldout = _write_heldout(tmp_path / "heldout", "2026-11-03", 203)  # not a multiple of the workers
    whole = pq.read_table(heldout).to_pydict()
    for world in (1, 2, 3, 4):
        shares = [heldout_rows(str(heldout), rank, world) for rank in range(world)]
        ids = [i for share in shares for i in share["problem_id"]]
        assert sorted(ids) == sorted(whole["problem_id"]) and len(ids) == 203
        assert max(len(s["prompt"]) for s in shares) - min(len(s["prompt"]) for s in shares) <= 1
        for share in shares:  # each prompt keeps its own answer
            answers = dict(zip(whole["problem_id"], whole["answer"], strict=True))
            assert all(answers[i] == a for i, a in zip(share["problem_id"], share["answer"], strict=True))


def test_two_workers_evaluation_is_the_whole_sets_exact_match(trained: dict[str, Any], tmp_path: Path) -> None:
    heldout = _write_heldout(tmp_path / "heldout", trained["date"], 200)
    predictor = Predictor.from_checkpoint(trained["checkpoint"], backend="jax")

    def complete(prompts: list[str]) -> list[str]:
        return [o.text for o in predictor.complete(prompts)]

    # the collective, as rank 0 sees it: rank 1's counts arrive beside its own
    sent: dict[int, np.ndarray] = {}
    common = {"world": 2, "framework": "jax", "step": 1500, "started": time.perf_counter()}
    evaluate_on_workers(complete, str(heldout), rank=1, sum_across=lambda v: sent.setdefault(1, v), **common)
    summary = evaluate_on_workers(complete, str(heldout), rank=0, sum_across=lambda v: v + sent[1], **common)

    held = pq.read_table(heldout, columns=["prompt", "answer"]).to_pydict()
    expected = exact_match(predictor, held["prompt"], held["answer"])
    assert summary["n"] == 200 and summary["accuracy"] == pytest.approx(expected) and expected >= 0.9
    assert summary["correct"] == round(expected * 200)
    assert (summary["num_hosts"], summary["hosts_used"], summary["in_training"]) == (2, 2, True)
    assert summary["examples_per_s"] > 0 and summary["eval_seconds"] > 0
    first = heldout_rows(str(heldout), 0, 2)  # rank 0's own first answers
    assert [s["prompt"] for s in summary["samples"]] == first["prompt"][:5]
    assert [s["completion"] for s in summary["samples"]] == complete(first["prompt"][:5])


def test_a_worker_without_rows_is_not_counted_as_a_host_used(trained: dict[str, Any], tmp_path: Path) -> None:
    heldout = _write_heldout(tmp_path / "heldout", trained["date"], 1, files=1)
    predictor = Predictor.from_checkpoint(trained["checkpoint"])
    summary = evaluate_on_workers(
        lambda prompts: [o.text for o in predictor.complete(prompts)], str(heldout),
        rank=1, world=2, sum_across=lambda v: v, framework="jax", step=1, started=time.perf_counter(),
    )  # fmt: skip
    assert (summary["n"], summary["hosts_used"], summary["accuracy"]) == (0, 0, 0.0)
