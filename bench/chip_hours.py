"""chip_hours_ratio: TPU chip-hours billed for the training slice / chip-hours spent training, for the
GKE pipeline's new shape (prep on CPU while the pool is created; the slice deleted right after
training) against the old one (pool first, prep on it, evaluation and serving before the delete), in
the same run (goal: <= 1.15).

Run: .venv/bin/python -m bench --only chip_hours_ratio   (or python -m bench.chip_hours [--scale 0.02])

Both shapes drive the GKE API stand-in for real (create and delete node pools through its API; the
ledger is read back from its operations' startTime/endTime, as tpuflow.cost.ledger does in a run);
the Ray steps between them are sleeps. Time is scaled: one simulated minute lasts ``scale`` seconds.

Where the durations come from: they are ASSUMPTIONS, not measurements (no TPU project is reachable
from this machine, and GKE publishes no provisioning times). ASSUMED_MINUTES below states each one;
``details`` also gives the ratio for a shorter and a longer training run, since the ratio is
(fixed overhead + training) / training.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.core import Context, Result, goal_check, measure

GOAL = 1.15
CHIPS = 16  # v6e 4x4: 4 hosts of 4 chips
ASSUMED_MINUTES = {
    "create_pool": 6.0,  # multi-host TPU node pool, on-demand capacity available
    "delete_pool": 3.0,
    "cpu_cluster": 2.0,  # head-only RayCluster: pod scheduled on an existing CPU node, image cached
    "tpu_cluster": 3.0,  # TPU RayCluster on the new nodes: image pull on fresh VMs
    "prep": 5.0,
    "train": 120.0,
    "evaluate": 5.0,
    "serve": 12.0,  # serve config, serve pool create, RayService deploy, smoke test, report
}
PROJECT, ZONE, CLUSTER = "bench-proj", "us-east5-b", "bench"


def _pool(name: str) -> dict[str, Any]:
    return {
        "nodePool": {
            "name": name,
            "config": {"machineType": "ct6e-standard-4t"},
            "initialNodeCount": 4,
            "locations": [ZONE],
            "placementPolicy": {"type": "COMPACT", "tpuTopology": "4x4"},
        }
    }


def _wait_done(gke: Any, op_name: str) -> None:
    while gke.get_operation(PROJECT, ZONE, op_name)["status"] != "DONE":
        time.sleep(0.005)


def _create(gke: Any, name: str, minutes: float, scale: float) -> None:
    gke.operation_seconds = minutes * scale
    _wait_done(gke, gke.create_node_pool(PROJECT, ZONE, CLUSTER, _pool(name))["name"])


def _delete(gke: Any, name: str, minutes: float, scale: float) -> None:
    gke.operation_seconds = minutes * scale
    _wait_done(gke, gke.delete_node_pool(PROJECT, ZONE, CLUSTER, name)["name"])


def run_shape(gke: Any, shape: str, minutes: dict[str, float], scale: float) -> dict[str, float]:
    """One run of the pipeline's TPU-slice timeline; returns billed and training chip-hours (simulated)."""
    import threading

    from tpuflow.cost.ledger import pool_span

    name = f"train-{shape}"
    step = lambda key: time.sleep(minutes[key] * scale)  # noqa: E731
    if shape == "old":
        _create(gke, name, minutes["create_pool"], scale)
        step("tpu_cluster")
        step("prep")
        t0 = time.time()
        step("train")
        trained = time.time() - t0
        step("evaluate")
        step("serve")
        _delete(gke, name, minutes["delete_pool"], scale)
    else:
        pool = threading.Thread(target=_create, args=(gke, name, minutes["create_pool"], scale))
        pool.start()
        step("cpu_cluster")
        step("prep")  # on CPU, while the pool is created
        pool.join()
        step("tpu_cluster")
        t0 = time.time()
        step("train")
        trained = time.time() - t0
        _delete(gke, name, minutes["delete_pool"], scale)  # evaluation and serving go on without it
    created, deleted = pool_span(gke.list_operations(PROJECT, ZONE)["operations"], name)
    assert created is not None and deleted is not None
    billed = CHIPS * (deleted - created) / scale / 60.0  # back to simulated chip-hours
    training = CHIPS * trained / scale / 60.0
    return {"billed_chip_hours": billed, "training_chip_hours": training, "ratio": billed / training}


def compare(scale: float, train_minutes: float | None = None) -> dict[str, dict[str, float]]:
    from tpuflow.dev.standins.gke_api import GKEApiStandin

    minutes = dict(ASSUMED_MINUTES)
    if train_minutes is not None:
        minutes["train"] = train_minutes
    gke = GKEApiStandin(clusters=[f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}"])
    return {shape: run_shape(gke, shape, minutes, scale) for shape in ("old", "new")}


@measure("chip_hours_ratio")
def chip_hours_ratio(ctx: Context) -> list[Result]:
    scale = 0.01  # 0.6 s per simulated hour: sleeps and the stand-in's operations stay well above timer noise
    main = compare(scale)
    short, long_ = compare(scale, 30.0), compare(scale, 480.0)
    new, old = main["new"]["ratio"], main["old"]["ratio"]
    return [
        Result(
            name="chip_hours_ratio",
            value=new,
            unit="billed / training chip-hours",
            baseline=old,
            ratio=new / old,
            goal=f"<= {GOAL}",
            met=goal_check(new, "<=", GOAL),
            variant=f"v6e 4x4, {ASSUMED_MINUTES['train']:.0f} min training, assumed GKE/KubeRay times",
            baseline_is="the old GKE DAG shape (pool first, prep on it, deleted after serving), same run",
            ratio_means="new shape's ratio / old shape's ratio (value is the new shape's billed / training)",
            notes="durations are assumptions (bench/chip_hours.py ASSUMED_MINUTES), time-scaled on the GKE stand-in",
            details={
                "assumed_minutes": ASSUMED_MINUTES,
                "scale_s_per_minute": scale,
                "new": main["new"],
                "old": main["old"],
                "train_30_min": {k: v["ratio"] for k, v in short.items()},
                "train_480_min": {k: v["ratio"] for k, v in long_.items()},
            },
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chip_hours", description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.02, help="seconds per simulated minute")
    args = parser.parse_args(argv)
    for shape, figures in compare(args.scale).items():
        print(shape, {k: round(v, 3) for k, v in figures.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
