"""preflight_seconds — what the slice preflight (tpuflow_driver.preflight) adds before training.

The product's preflight job on a simulated v6e 2x4 of two 4-chip hosts (full set: also across two such
slices, on one cluster of two slices), with JAX (jax.distributed and one jitted sum over every device) and with the roll call's TCP
gather-sum alone, against the floor of any Ray job on the same cluster: an entrypoint that only
connects to Ray (`ray.init()`) and exits. ratio = preflight job ÷ that floor; the goal is on the value
(seconds): the preflight must stay well inside a minute.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from typing import Any

from bench.core import Context, Result, goal_check, measure, median, ratio

GOAL_S = 30.0
FLOOR = "python -c 'import ray; ray.init(); print(\"TPUFLOW_RESULT {}\")'"


def _job_s(hook: Any, entrypoint: str, env: dict[str, str], name: str) -> tuple[float, str]:
    from tpuflow import workloads_dir

    sid = f"bench-{name}-{time.time_ns() % 10**12}"
    t = time.perf_counter()
    hook.submit_job(entrypoint, sid, runtime_env={"working_dir": workloads_dir(), "env_vars": env})
    while (status := hook.get_job_status(sid)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.perf_counter() - t > 600:
            hook.stop_job(sid)
            raise RuntimeError(f"{name} did not end within 600 s")
        time.sleep(0.2)
    wall = time.perf_counter() - t
    logs = hook.get_job_logs(sid)
    if status != "SUCCEEDED":
        raise RuntimeError(f"{name} ended {status}:\n{logs[-2000:]}")
    return wall, logs


def _measure_on(ctx: Context, slice_counts: tuple[int, ...], repeats: int) -> list[Result]:
    """The preflight across each number of slices in `slice_counts`, on one cluster of the largest."""
    from tpuflow.local.cluster import LocalRayCluster
    from tpuflow.rayjob.hooks import RayJobHook, parse_result
    from tpuflow.tpu import TpuSlice

    whole = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t", max(slice_counts))
    cluster = LocalRayCluster.start(whole, f"bench-pf{whole.num_slices}", ctx.work / "clusters-preflight", timeout=600)
    rows = []
    try:
        hook = RayJobHook(cluster=cluster.connection_info())
        py = shlex.quote(sys.executable)
        env = {"JAX_PLATFORMS": "cpu"}
        floor = median([_job_s(hook, FLOOR.replace("python", py, 1), env, "floor")[0] for _ in range(repeats)])
        for num_slices, collective in [(n, c) for n in slice_counts for c in ("jax", "tcp")]:
            tpu = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t", num_slices)
            spec = {**tpu.slice_placement_group_kwargs(), "deadline_s": 30, "collective": collective}
            entry = f"{py} -m tpuflow_driver.preflight --spec-json {shlex.quote(json.dumps(spec))}"
            runs = [_job_s(hook, entry, env, f"preflight-{collective}") for _ in range(repeats)]
            wall = median([w for w, _ in runs])
            phases = parse_result(runs[-1][1]) or {}
            ctx.log(f"preflight {collective} on {tpu.total_hosts} host(s): {wall:.1f}s (job floor {floor:.1f}s); "
                    f"{phases}")  # fmt: skip
            r = ratio(wall, floor)
            rows.append(Result(
                "preflight_seconds", wall, "s", floor, r, f"value <= {GOAL_S} s", goal_check(wall, "<=", GOAL_S),
                variant=f"{collective}, v6e 2x4 x {num_slices} ({tpu.total_hosts} hosts)",
                baseline_is="a Ray job that only calls ray.init() on the same cluster (the floor of any job)",
                ratio_means="preflight job ÷ the floor job",
                notes=f"median of {repeats}, on a cluster of {whole.num_slices} slice(s); the job's own phases (s): reserve {phases.get('reserve_s')}, "
                      f"roll call {phases.get('roll_call_s')}, all-reduce {phases.get('all_reduce_s')} "
                      f"(JAX init {phases.get('jax_init_s')})",
                details={k: phases.get(k) for k in ("reserve_s", "roll_call_s", "all_reduce_s", "jax_init_s",
                                                     "seconds", "devices")},
            ))  # fmt: skip
    finally:
        cluster.stop()
    return rows


@measure("preflight_seconds")
def preflight_seconds(ctx: Context) -> list[Result]:
    return _measure_on(ctx, (1,) if ctx.quick else (1, 2), 1)
