"""chip_hours_ratio: TPU chip-hours billed for the training slice / chip-hours spent training, for the
GKE pipeline's new shape (prep on CPU while the pool is created; the slice deleted right after
training) against the old one (pool first, prep on it, evaluation and serving before the delete), in
the same run (goal: <= 1.15).

Run: .venv/bin/python -m bench --only chip_hours_ratio   (or python -m bench.chip_hours [--scale 0.02])

Both shapes drive the GKE API stand-in for real (create and delete node pools through its API; the
ledger is read back from its operations' startTime/endTime, as tpuflow.cost.ledger does in a run);
the Ray steps between them are sleeps. Time is scaled: one simulated minute lasts ``scale`` seconds.

Both figures come from the run's own timeline, as a pipeline run's ledger builds it (tpuflow.cost.goodput):
the pool's span and readiness from the stand-in's operations, each Ray step on the slice recorded as a work
span as it ran, and the training split by a real StepClock (tpuflow_driver.goodput) over a loop of
time-scaled steps with a first step that compiles and periodic checkpoint saves. ``chip_hours_ratio`` is
billed ÷ the training job's chip-hours on that timeline; ``goodput`` (measure ``gke_goodput``) is productive
steps ÷ billed (goal >= 0.85 at 120 min of training).

Where the durations come from: they are ASSUMPTIONS, not measurements (no TPU project is reachable
from this machine, and GKE publishes no provisioning times). ASSUMED_MINUTES below states each one;
``details`` also gives the figures for a shorter and a longer training run, since the ratio is
(fixed overhead + training) / training.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench.core import WORKLOADS, Context, Result, goal_check, measure

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
    # inside "train": its steps (0.5 min of them between two looks of the clock), of which the first also
    # compiles, and a checkpoint saved every "checkpoint_every" minutes of steps
    "compile": 1.0,
    "checkpoint_save": 0.25,
    "checkpoint_every": 10.0,
}
STEP_MINUTES = 0.5
GOODPUT_GOAL = 0.85
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


def _train(minutes: dict[str, float], scale: float) -> dict[str, Any]:
    """The training job as its loop would record it: a StepClock over time-scaled steps; its breakdown."""
    if str(WORKLOADS) not in sys.path:
        sys.path.insert(0, str(WORKLOADS))
    from tpuflow_driver.goodput import StepClock

    clock = StepClock()
    clock.begin(0)
    steps = round(minutes["train"] / STEP_MINUTES)
    save_every = max(1, round(minutes["checkpoint_every"] / STEP_MINUTES))
    for step in range(1, steps + 1):
        time.sleep((STEP_MINUTES + (minutes["compile"] if step == 1 else 0.0)) * scale)
        clock.step(step)
        if step % save_every == 0 or step == steps:
            time.sleep(minutes["checkpoint_save"] * scale)
            clock.mark("checkpoint")
    return dict(clock.seconds)


def run_shape(gke: Any, shape: str, minutes: dict[str, float], scale: float) -> dict[str, Any]:
    """One run of the pipeline's TPU-slice timeline; returns its billed and training chip-hours (simulated) and
    goodput, from the timeline the ledger would build of it."""
    import threading

    from tpuflow.cost.goodput import run_goodput, slice_timeline
    from tpuflow.cost.ledger import pool_ready, pool_span

    name = f"train-{shape}"
    works: list[dict[str, Any]] = []

    def step(key: str, cause: str | None = None) -> None:
        started = time.time()
        breakdown = _train(minutes, scale) if key == "train" else time.sleep(minutes[key] * scale)
        if cause is not None:  # work on the slice, recorded as its task would (tpuflow.work_spans)
            works.append({"cause": cause, "started_at": started, "ended_at": time.time(), "breakdown": breakdown})

    if shape == "old":
        _create(gke, name, minutes["create_pool"], scale)
        step("tpu_cluster")
        step("prep", "data_prep")
        step("train", "training")
        step("evaluate", "evaluation")
        step("serve", "serving")
        _delete(gke, name, minutes["delete_pool"], scale)
    else:
        pool = threading.Thread(target=_create, args=(gke, name, minutes["create_pool"], scale))
        pool.start()
        step("cpu_cluster")
        step("prep")  # on CPU, while the pool is created
        pool.join()
        step("tpu_cluster")
        step("train", "training")
        _delete(gke, name, minutes["delete_pool"], scale)  # evaluation and serving go on without it
    operations = gke.list_operations(PROJECT, ZONE)["operations"]
    created, deleted = pool_span(operations, name)
    assert created is not None and deleted is not None
    timeline = slice_timeline(created, deleted, works, now=time.time(), provisioned_at=pool_ready(operations, name))
    measured = run_goodput([{"chips": CHIPS, "timeline": timeline}])
    (train,) = [w for w in works if w["cause"] == "training"]
    to_hours = CHIPS / scale / 60.0  # real seconds back to simulated chip-hours
    billed, training = (deleted - created) * to_hours, (train["ended_at"] - train["started_at"]) * to_hours
    return {
        "billed_chip_hours": billed,
        "training_chip_hours": training,
        "ratio": billed / training,
        "goodput": measured["goodput"],
        "minutes_by_cause": {k: round(v / scale, 1) for k, v in timeline["seconds"].items()},
    }


def compare(scale: float, train_minutes: float | None = None) -> dict[str, dict[str, Any]]:
    from tpuflow_rehearsal.standins.gke_api import GKEApiStandin

    minutes = dict(ASSUMED_MINUTES)
    if train_minutes is not None:
        minutes["train"] = train_minutes
    gke = GKEApiStandin(clusters=[f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}"])
    return {shape: run_shape(gke, shape, minutes, scale) for shape in ("old", "new")}


def _new_shape_vs_old(
    main: dict[str, dict[str, Any]],
    key: str,
    name: str,
    op: str,
    goal: float,
    *,
    unit: str,
    ratio_means: str,
    notes: str,
    details: dict[str, Any],
) -> Result:
    """The new GKE DAG shape's ``key`` against the old shape's, both from the same run: the Result ``name``, met
    when the new shape's value is ``op`` (">=" or "<=") ``goal``."""
    new, old = main["new"][key], main["old"][key]
    return Result(
        name=name,
        value=new,
        unit=unit,
        baseline=old,
        ratio=new / old,
        goal=f"{op} {goal}",
        met=goal_check(new, op, goal),
        variant=f"v6e 4x4, {ASSUMED_MINUTES['train']:.0f} min training, assumed GKE/KubeRay times",
        baseline_is="the old GKE DAG shape (pool first, prep on it, deleted after serving), same run",
        ratio_means=ratio_means,
        notes=notes,
        details=details,
    )


@measure("chip_hours_ratio", produces=("gke_goodput",))
def chip_hours_ratio(ctx: Context) -> list[Result]:
    scale = 0.01  # 0.6 s per simulated hour: sleeps and the stand-in's operations stay well above timer noise
    main = compare(scale)
    short, long_ = compare(scale, 30.0), compare(scale, 480.0)
    return [
        _new_shape_vs_old(
            main,
            "goodput",
            "gke_goodput",
            ">=",
            GOODPUT_GOAL,
            unit="productive / billed chip-seconds",
            ratio_means="new shape's goodput / old shape's",
            notes="the ledger's timeline of a time-scaled run on the GKE stand-in; durations are assumptions",
            details={
                "new_minutes_by_cause": main["new"]["minutes_by_cause"],
                "old_minutes_by_cause": main["old"]["minutes_by_cause"],
                "train_30_min": {k: v["goodput"] for k, v in short.items()},
                "train_480_min": {k: v["goodput"] for k, v in long_.items()},
            },
        ),
        _new_shape_vs_old(
            main,
            "ratio",
            "chip_hours_ratio",
            "<=",
            GOAL,
            unit="billed / training chip-hours",
            ratio_means="new shape's ratio / old shape's ratio (value is the new shape's billed / training)",
            notes="from the run's timeline (tpuflow.cost.goodput); durations are assumptions (ASSUMED_MINUTES), "
            "time-scaled on the GKE stand-in",
            details={
                "assumed_minutes": ASSUMED_MINUTES,
                "scale_s_per_minute": scale,
                "new": {k: v for k, v in main["new"].items() if k != "minutes_by_cause"},
                "old": {k: v for k, v in main["old"].items() if k != "minutes_by_cause"},
                "train_30_min": {k: v["ratio"] for k, v in short.items()},
                "train_480_min": {k: v["ratio"] for k, v in long_.items()},
            },
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chip_hours", description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.02, help="seconds per simulated minute")
    args = parser.parse_args(argv)
    for shape, figures in compare(args.scale).items():
        print(shape, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
