"""Exact-match accuracy of a checkpoint on a parquet set, with Ray Data batch inference.

    python -m addition.evaluate --checkpoint PATH --framework jax|torch --data DIR/heldout
                                [--output PATH] [--batch-size 256]

--framework picks the forward pass (jax jit or torch); both read the same checkpoint layout.
Prints `TPUFLOW_RESULT {"accuracy", "n", "correct", "checkpoint", "framework", "step",
"samples": [first 5 {"prompt", "completion", "expected"}], "output"}`.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np
from tpuflow_driver import storage
from tpuflow_driver.result import emit_result


class CheckpointPredictor:
    """Ray Data callable class: loads the checkpoint once per actor, completes a batch of prompts."""

    def __init__(self, checkpoint: str, framework: str):
        from addition.checkpoint import local_copy
        from addition.inference import Predictor

        if framework == "jax":
            # inference of this tiny model belongs on the CPU even on a TPU host
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
        with local_copy(checkpoint) as d:
            self.predictor = Predictor.from_checkpoint(d, backend=framework)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prompts = [str(p) for p in batch["prompt"]]
        outs = self.predictor.complete(prompts)
        completions = np.array([o.text for o in outs], dtype=object)
        expected = np.array([str(a) for a in batch["answer"]], dtype=object)
        return {
            "problem_id": batch["problem_id"],
            "prompt": np.array(prompts, dtype=object),
            "completion": completions,
            "expected": expected,
            "correct": completions == expected,
        }


def evaluate(checkpoint: str, framework: str, data: str, batch_size: int = 256) -> tuple[dict[str, Any], list[dict]]:
    import ray
    from addition.checkpoint import load_meta, local_copy
    from ray.data import ActorPoolStrategy, DataContext

    checkpoint = storage.normalize(checkpoint)
    with local_copy(checkpoint) as d:
        meta = load_meta(d)  # fail here, in the driver, on a path that is not a checkpoint
    storage.quiet_ray_data()
    DataContext.get_current().execution_options.preserve_order = True
    data_fs, data_path = storage.resolve(data)
    rows = (
        ray.data.read_parquet(data_path, filesystem=data_fs, columns=["problem_id", "prompt", "answer"])
        .map_batches(
            CheckpointPredictor,
            fn_constructor_kwargs={"checkpoint": checkpoint, "framework": framework},
            batch_size=batch_size,
            batch_format="numpy",
            compute=ActorPoolStrategy(size=1),
        )
        .take_all()
    )
    n = len(rows)
    correct = int(sum(bool(r["correct"]) for r in rows))
    predictions = [
        {"problem_id": int(r["problem_id"]), "prompt": r["prompt"], "completion": r["completion"],
         "expected": r["expected"], "correct": bool(r["correct"])}
        for r in rows
    ]  # fmt: skip
    summary = {
        "accuracy": correct / n if n else 0.0,
        "n": n,
        "correct": correct,
        "checkpoint": checkpoint,
        "framework": framework,
        "trained_with": meta.framework,
        "step": meta.step,
        "samples": [{k: p[k] for k in ("prompt", "completion", "expected")} for p in predictions[:5]],
    }
    return summary, predictions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m addition.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (local or gs://...)")
    p.add_argument("--framework", required=True, choices=("jax", "torch"), help="forward pass to evaluate with")
    p.add_argument("--data", required=True, help="parquet directory with prompt/answer columns (prep's heldout)")
    p.add_argument("--output", help="write every prediction and the summary as JSON here (local or gs://...)")
    p.add_argument("--batch-size", type=int, default=256)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    summary, predictions = evaluate(args.checkpoint, args.framework, args.data, args.batch_size)
    if args.output:
        storage.write_text(args.output, json.dumps({**summary, "predictions": predictions}, indent=1))
        summary["output"] = storage.normalize(args.output)
    print(f"[evaluate] exact match {summary['correct']}/{summary['n']} = {summary['accuracy']:.3f}", flush=True)
    emit_result(summary)


if __name__ == "__main__":
    main()
