"""The held-out evaluation on the training workers, right after the last step (the pipeline's
``Workload(evaluate_in_training=True)``, train_loop_config ``heldout``).

The model is already in the workers' memory and the slice is already held: no second job starts actors,
imports the framework and loads the checkpoint again (what ``python -m addition.evaluate`` pays, about
25 s for 200 problems on this repository's machines, bench ``eval_examples_per_s``). Each worker answers
every ``world``-th problem of the set (rows rank, rank + world, ... in ``problem_id`` order: none dropped,
none twice, whatever the set's size), the counts are summed with the framework's own collective, and the
loop reports the summary with its last checkpoint as the metric ``evaluation``: the keys
``addition.evaluate`` prints, so the report and the quality gate read either alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from addition.inference import Predictor

COLUMNS = ["problem_id", "prompt", "answer"]


def heldout_rows(path: str, rank: int, world: int) -> dict[str, list[Any]]:
    """This worker's share of the held-out parquet set at ``path`` (local or gs://): rows rank::world."""
    import pyarrow.dataset as pads
    from tpuflow_driver import storage  # pyarrow: imported when a held-out set is read

    fs, where = storage.resolve_with_deadline(path)
    table = pads.dataset(where, filesystem=fs, format="parquet").to_table(columns=COLUMNS)
    rows = table.sort_by("problem_id").to_pydict()  # one order on every worker
    return {column: values[rank::world] for column, values in rows.items()}


def evaluate_on_workers(
    complete: Callable[[list[str]], list[str]],
    path: str,
    *,
    rank: int,
    world: int,
    sum_across: Callable[[np.ndarray], np.ndarray],
    framework: str,
    step: int,
    started: float,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Exact-match accuracy over the whole set at ``path``; every worker calls it (``sum_across`` is a
    collective). ``complete``: prompts -> completions with the weights in memory; ``started``: when this
    worker began (``time.perf_counter``), so building the forward pass counts as evaluation time."""
    rows = heldout_rows(path, rank, world)
    completions: list[str] = []
    for i in range(0, len(rows["prompt"]), batch_size):
        completions += complete([str(p) for p in rows["prompt"][i : i + batch_size]])
    expected = [str(a) for a in rows["answer"]]
    correct = sum(c == e for c, e in zip(completions, expected, strict=True))
    mine = np.array([correct, len(completions), 1 if completions else 0], dtype=np.int64)
    total_correct, n, hosts_used = (int(x) for x in sum_across(mine))
    seconds = time.perf_counter() - started
    return {
        "accuracy": total_correct / n if n else 0.0,
        "n": n,
        "correct": total_correct,
        "framework": framework,
        "step": step,
        "num_hosts": world,
        "hosts_used": hosts_used,
        "eval_seconds": round(seconds, 3),
        # the forward pass built and compiled included: what the run waits for
        "examples_per_s": round(n / seconds, 1) if seconds > 0 else None,
        "in_training": True,
        "samples": [
            {"prompt": str(p), "completion": c, "expected": e}
            for p, c, e in zip(rows["prompt"][:5], completions[:5], expected[:5], strict=False)
        ],
    }


def evaluation_at_the_end(
    cfg: dict[str, Any],
    at_step: int,
    predictor: Callable[[], Predictor],
    sum_across: Callable[[np.ndarray], np.ndarray],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """What a Ray Train worker's loop adds to its report at ``at_step``: ``{"evaluation": summary}`` at the last
    step when ``cfg["heldout"]`` names the set, else nothing. ``predictor``: builds the forward pass from the
    weights in memory (timed as part of the evaluation); ``sum_across``: the framework's sum over the workers."""
    if not cfg["heldout"] or at_step < int(cfg["num_steps"]):
        return {}
    import ray.train

    context = ray.train.get_context()
    started = time.perf_counter()
    forward = predictor()
    summary = evaluate_on_workers(
        lambda prompts: [o.text for o in forward.complete(prompts)],
        cfg["heldout"],
        rank=context.get_world_rank(),
        world=context.get_world_size(),
        sum_across=sum_across,
        framework=forward.meta.framework,
        step=at_step,
        started=started,
    )
    log(f"held-out exact match {summary['correct']}/{summary['n']} = {summary['accuracy']:.3f} in training")
    return {"evaluation": summary}
