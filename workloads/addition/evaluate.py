"""Exact-match accuracy of a checkpoint on a parquet set, with Ray Data batch inference on every host.

    python -m addition.evaluate --checkpoint PATH --framework jax|torch --data DIR/heldout
                                [--output PATH] [--batch-size 256]
                                [--num-hosts N --tpu-per-host C --accelerator-type TPU-V6E]

--framework picks the forward pass (jax jit or torch); both read the same checkpoint layout.
The set is split over an actor pool of --num-hosts actors, each holding one host's TPU resources
({"TPU": C, "accelerator_type:<TYPE>": 0.001}, from the slice), so a slice evaluates in parallel.
Prints `TPUFLOW_RESULT {"accuracy", "n", "correct", "checkpoint", "framework", "step", "num_hosts",
"hosts_used", "examples_per_s", "eval_seconds", "samples": [first 5 {"prompt", "completion",
"expected"}], "output"}`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
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
        import ray

        # Which host answered: the simulated or real TPU worker (GKE's webhook sets TPU_WORKER_ID), else the node.
        node = ray.get_runtime_context().get_node_id()
        worker = os.environ.get("TPU_WORKER_ID")
        self.host = f"{os.environ.get('TPU_NAME', '')}/{worker}" if worker is not None else node

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
            "host": np.array([self.host] * len(prompts), dtype=object),
        }


ACTORS_READY_S = 600  # how long the evaluation waits for its actor on every host


def host_resources(tpu_per_host: int, accelerator_type: str | None) -> dict[str, Any]:
    """Ray options of one evaluation actor: one host's TPU chips and its accelerator type.

    No CPU: the TPU resource already claims the host, and on KubeRay the head offers no CPUs, so the
    read tasks need the hosts' CPUs.
    """
    if tpu_per_host <= 0:
        return {}
    resources: dict[str, float] = {"TPU": tpu_per_host}
    if accelerator_type:
        resources[f"accelerator_type:{accelerator_type}"] = 0.001
    return {"num_cpus": 0, "resources": resources}


def evaluate(
    checkpoint: str,
    framework: str,
    data: str,
    batch_size: int = 256,
    *,
    num_hosts: int = 1,
    tpu_per_host: int = 0,
    accelerator_type: str | None = None,
) -> tuple[dict[str, Any], list[dict]]:
    import ray
    from addition.checkpoint import load_meta, local_copy
    from ray.data import ActorPoolStrategy, DataContext

    checkpoint = storage.normalize(checkpoint)
    with local_copy(checkpoint) as d:
        meta = load_meta(d)  # fail here, in the driver, on a path that is not a checkpoint
    storage.quiet_ray_data()
    context = DataContext.get_current()
    context.execution_options.preserve_order = True
    if num_hosts > 1:
        # Ray Data hands blocks to whichever pool actor is ready first; a slow host start would leave
        # the others idle (or unused) while the slice bills. Wait for one actor on every host.
        context.wait_for_min_actors_s = ACTORS_READY_S
    data_fs, data_path = storage.resolve_with_deadline(data)
    held = ray.data.read_parquet(data_path, filesystem=data_fs, columns=["problem_id", "prompt", "answer"])
    total = held.count()
    if num_hosts > 1:
        # one block per host at least, so every actor gets a share of a small set
        held = held.repartition(num_hosts, shuffle=False)
    started = time.perf_counter()
    rows = held.map_batches(
        CheckpointPredictor,
        fn_constructor_kwargs={"checkpoint": checkpoint, "framework": framework},
        batch_size=max(1, min(batch_size, math.ceil(total / num_hosts))),
        batch_format="numpy",
        compute=ActorPoolStrategy(size=num_hosts),
        **host_resources(tpu_per_host, accelerator_type),
    ).take_all()
    seconds = time.perf_counter() - started
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
        "num_hosts": num_hosts,
        "hosts_used": len({r["host"] for r in rows}),
        "eval_seconds": round(seconds, 3),
        # actor start (checkpoint load, jit) included: what a pipeline run waits for
        "examples_per_s": round(n / seconds, 1) if seconds > 0 else None,
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
    p.add_argument("--num-hosts", type=_at_least(1), default=1, help="actors: one per TPU host of the slice")
    p.add_argument("--tpu-per-host", type=_at_least(0), default=0, help="Ray TPU resource each actor holds")
    p.add_argument("--accelerator-type", default=None, help="Ray accelerator type of the hosts, e.g. TPU-V6E")
    return p.parse_args(argv)


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    summary, predictions = evaluate(
        args.checkpoint,
        args.framework,
        args.data,
        args.batch_size,
        num_hosts=args.num_hosts,
        tpu_per_host=args.tpu_per_host,
        accelerator_type=args.accelerator_type,
    )
    if args.output:
        storage.write_text(args.output, json.dumps({**summary, "predictions": predictions}, indent=1))
        summary["output"] = storage.normalize(args.output)
    print(
        f"[evaluate] exact match {summary['correct']}/{summary['n']} = {summary['accuracy']:.3f}; "
        f"{summary['examples_per_s']} examples/s on {summary['hosts_used']} of {summary['num_hosts']} host(s)",
        flush=True,
    )
    emit_result(summary)


if __name__ == "__main__":
    main()
