"""cluster_start_s / cluster_stop_s: LocalRayCluster start and stop for simulated v6e slices, vs plain
`ray start` (head, then one `ray start --address` per host) and a signal-and-wait stop of the same
processes (what `ray stop` does, limited to this cluster's pids), measured the same way: from the
first command until every node is ALIVE on the dashboard / every process is gone.

Each side runs under cProfile; the rows' details say where the product's time goes.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from bench.core import Context, Result, goal_check, kill_pids, measure, pid_alive, pids_with_marker, ratio

# Goals set after measuring (see bench/README.md): start within 1.5x of plain `ray start` of the same
# processes; stop within 5 s (signal, wait on the pids we own, escalate).
START_GOAL_RATIO = 1.5
STOP_GOAL_S = 5.0
NODE_IP = "127.0.0.2"
PROFILED = ("_wait_for_dashboard", "_wait_for_nodes", "_spawn", "_group_alive", "_groups_alive", "_wait_owned_gone", "_owned_targets",
            "_pids_referencing", "_kill_node", "_keep_ray_logs", "rmtree", "nodes_summary", "sleep", "free_port")  # fmt: skip


def _where(prof: cProfile.Profile) -> dict[str, float]:
    """Cumulative seconds of the functions that matter, from a cProfile run."""
    stats = pstats.Stats(prof)
    out: dict[str, float] = {}
    for (_file, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        name = fn.strip("<>").split(" ")[-1].strip("'")
        for want in PROFILED:
            if name == want or name.endswith(f".{want}"):
                out[want] = round(out.get(want, 0.0) + ct, 2)
    return out


def _product(tpu: Any, base: Path) -> tuple[float, float, dict[str, Any]]:
    from tpuflow.local.cluster import LocalRayCluster, _pids_referencing

    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    cluster = LocalRayCluster.start(tpu, f"bench-{tpu.topology}", base, head_cpus=2, timeout=600)
    prof.disable()
    start_s = time.perf_counter() - t
    start_where = _where(prof)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    cluster.stop()
    prof.disable()
    stop_s = time.perf_counter() - t
    left = [p for p in _pids_referencing(cluster.temp_dir) if pid_alive(p)]
    if left:
        kill_pids(left)
    return start_s, stop_s, {"start_profile_s": start_where, "stop_profile_s": _where(prof), "left_after_stop": left}


def _alive_nodes(dashboard: str, headers: dict[str, str]) -> int:
    try:
        resp = requests.get(f"{dashboard}/api/v0/nodes", headers=headers, timeout=5)
        return sum(1 for n in resp.json()["data"]["result"]["result"] if n.get("state") == "ALIVE")
    except (requests.RequestException, KeyError, ValueError):
        return 0


last_plain_stop_survivors: list[str] = []


def _term_and_wait(pids: list[int], grace: float) -> tuple[float, list[str]]:
    """SIGTERM every pid, wait up to `grace` (ray stop's default), then SIGKILL; returns the seconds taken
    and the processes still alive 3 s after SIGTERM (name: seconds they took to go)."""
    names = {p: _name(p) for p in pids}
    t = time.perf_counter()
    for p in pids:
        try:
            os.kill(p, 15)
        except ProcessLookupError:
            pass
    gone: dict[int, float] = {}
    while time.perf_counter() - t < grace and len(gone) < len(pids):
        for p in pids:
            if p not in gone and not pid_alive(p):
                gone[p] = time.perf_counter() - t
        time.sleep(0.1)
    left = [p for p in pids if p not in gone]
    if left:
        kill_pids(left, timeout=5)
    took = time.perf_counter() - t
    slow = [f"{names[p]}: {gone.get(p, took):.1f}s{'' if p in gone else ' (SIGKILL)'}" for p in pids
            if gone.get(p, took) > 3.0]  # fmt: skip
    return took, slow


def _name(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in args[:3] if a]
    exe = next((w for w in words if not w.endswith(("python", "python3")) and w != "-u"), words[0] if words else "?")
    return Path(exe).name


def _plain(tpu: Any) -> tuple[float | None, float | None]:
    """`ray start` of the same nodes (same resources, env and loopback address), then a plain stop."""
    from tpuflow.local.cluster import free_port

    temp = tempfile.mkdtemp(prefix="tpp-", dir="/tmp")
    token = Path(temp) / "token"
    token.write_text(os.urandom(16).hex())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TPU_"))}
    # The same registration waits the product gives its nodes (they grow with the load average).
    from tpuflow.local.cluster import _load_factor

    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_raylet_start_wait_time_s": str(int(120 * _load_factor())),
                "RAY_agent_register_timeout_ms": str(int(120000 * _load_factor())),
                "JAX_PLATFORMS": "cpu", "TPUFLOW_BENCH_MARK": temp, **tpu.ray_env})  # fmt: skip
    ray_bin = str(Path(sys.executable).with_name("ray"))
    headers = {"Authorization": f"Bearer {token.read_text()}"}
    gcs, dash = free_port(), free_port()
    dashboard = f"http://127.0.0.1:{dash}"
    common = [f"--node-ip-address={NODE_IP}", "--disable-usage-stats", "--object-store-memory=200000000"]
    log = open(Path(temp) / "ray-start.log", "ab")  # noqa: SIM115 (a file, not a pipe: daemons inherit it)

    def ray_start(args: list[str], env: dict[str, str]) -> None:
        subprocess.run([ray_bin, "start", *args, *common], env=env, check=True, stdout=log, stderr=subprocess.STDOUT,
                       timeout=300)  # fmt: skip

    try:
        t = time.perf_counter()
        ray_start(
            [
                "--head",
                f"--port={gcs}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dash}",
                "--include-dashboard=true",
                "--num-cpus=2",
                f"--temp-dir={temp}/n0",
            ],
            env,
        )
        i = 0
        for s in range(tpu.num_slices):
            for w in range(tpu.num_hosts):
                i += 1
                host_env = {**env, **tpu.simulated_host_env(f"plain-slice-{s}", w, [NODE_IP] * tpu.num_hosts)}
                ray_start(
                    [
                        f"--address={NODE_IP}:{gcs}",
                        "--num-cpus=1",
                        f"--resources={json.dumps(tpu.ray_worker_resources)}",
                        f"--temp-dir={temp}/n{i}",
                    ],
                    host_env,
                )
        deadline = time.time() + 300
        while time.time() < deadline and _alive_nodes(dashboard, headers) < 1 + tpu.total_hosts:
            time.sleep(0.5)
        start_s = time.perf_counter() - t
        t = time.perf_counter()
        stop_s, slow = _term_and_wait([p for p in pids_with_marker(temp) if pid_alive(p)], grace=16)
        last_plain_stop_survivors[:] = slow
    finally:
        log.close()
        left = [p for p in pids_with_marker(temp) if pid_alive(p)]
        if left:
            kill_pids(left, timeout=5)
        shutil.rmtree(temp, ignore_errors=True)
    return start_s, stop_s


@measure("cluster_start_s", produces=("cluster_stop_s",))
def cluster_start_stop(ctx: Context) -> list[Result]:
    from tpuflow.tpu import TpuSlice

    rows = []
    # quick: one host; full: the smallest multi-host slice (two 4-chip hosts; the 4x4's four hosts took
    # 27 s against 11 s for 2x2 in the 2026-12-02 run, each host's registration waited for in turn)
    for topo, machine in [("2x2", None)] if ctx.quick else [("2x4", "ct6e-standard-4t")]:
        tpu = TpuSlice.from_spec("TPU-V6E", topo, machine)
        start_s, stop_s, where = _product(tpu, ctx.work / "clusters-startstop")
        ctx.log(f"v6e {topo}: product start {start_s:.1f}s, stop {stop_s:.1f}s; profile {where}")
        try:
            plain_start, plain_stop = _plain(tpu)
        except subprocess.SubprocessError as err:  # plain `ray start` has no retry: keep the product's figures
            ctx.log(f"v6e {topo}: the plain `ray start` baseline failed ({str(err)[:200]}); no baseline this run")
            plain_start = plain_stop = None
            last_plain_stop_survivors[:] = ["the plain baseline did not start"]
        ctx.log(f"v6e {topo}: start {start_s:.1f}s (plain {plain_start}s), stop {stop_s:.1f}s (plain {plain_stop}s)")
        nodes = f"{1 + tpu.total_hosts} Ray nodes (head + {tpu.total_hosts} simulated host(s))"
        r = ratio(start_s, plain_start)
        rows.append(Result(
            "cluster_start_s", start_s, "s", plain_start, r, f"ratio <= {START_GOAL_RATIO}",
            goal_check(r, "<=", START_GOAL_RATIO), variant=f"v6e {topo}",
            baseline_is=f"plain `ray start` of the same {nodes}, until all are ALIVE",
            notes=f"where the time goes (cProfile, cumulative s): {where['start_profile_s']}",
            details={"profile_s": where["start_profile_s"]},
        ))  # fmt: skip
        rows.append(Result(
            "cluster_stop_s", stop_s, "s", plain_stop, ratio(stop_s, plain_stop), f"value <= {STOP_GOAL_S} s",
            goal_check(stop_s, "<=", STOP_GOAL_S), variant=f"v6e {topo}",
            baseline_is="SIGTERM to the same processes by pid and wait until gone (ray stop's way, this cluster only)",
            notes=f"where the time goes (cProfile, cumulative s): {where['stop_profile_s']}; processes slower than "
                  f"3 s to exit on SIGTERM (plain side): {last_plain_stop_survivors or 'none'}",
            details={"profile_s": where["stop_profile_s"], "left_after_stop": where["left_after_stop"],
                     "plain_stop_slower_than_3s": list(last_plain_stop_survivors)},
        ))  # fmt: skip
    return rows
