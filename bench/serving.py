"""The serve_* measures: the demo's Serve app (workloads/addition/serve_app.py, deployed with the pipeline's
own config, tpuflow.pipeline.steps.serve_config_for) against a plain Ray Serve app on the same cluster in
the same run, and a direct in-process forward of the same request (same backend as the app) as the
latency baseline. Every endpoint gets: p50 (and p90/p95/p99) of sequential requests (round robin over the
endpoints), and requests/s at 1, 8 and 32 concurrent clients (the median of a few windows per endpoint, the
endpoints in turn), after a warm-up burst.

"demo app" is the app as the pipeline deploys it: request batching is then off on a CPU or single-host
replica and on (max_batch_size 32) on a multi-host one (addition.serve_app.MULTI_HOST_MAX_BATCH_SIZE);
"demo app, batched" / "demo app, batching off" is the same app with the other setting (deployment_options).

- serve_overhead_p50_ms / serve_rps_32 / serve_batched_rps_32 (CPU replica): on the bench's shared
  head-only cluster (replicas are CPU actors): the demo app, the same app batched (`BATCHING`, a second
  app) and the plain app, all deployed at once.
- serve_*_multi_host / serve_*_single_host_tpu / serve_batched_rps_32 (the serving set only: `--serving`,
  make bench-serving, or `--only`): a separate LocalRayCluster with one simulated v6e 2x4 slice (2 hosts of 4 chips). First the demo
  app with serve_slice = that slice (one replica spanning both hosts, addition.slice_serving), batched by
  default, then with batching off (the same replica, reconfigured through its user_config); then with the
  pipeline's single-host serve slice (v6e 2x2: a replica holding one host's TPU, jax in process), the demo
  app and the same app batched side by side (one replica per host). The plain app (a CPU replica on the
  head) is measured beside each phase.
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from bench.core import JOBS, WORKLOADS, Context, Result, goal_check, measure, median, percentile, ratio

PROMPT = "17+25="
CLIENTS = (1, 8, 32)
QS = (50, 90, 95, 99)
# The batching setting measured (tpuflow deployment_options, the replica's user_config): batches of up to 32
# requests, no batch wait (the default: the requests that came while a batch ran form the next one); and off.
BATCHING: dict[str, Any] = {"max_batch_size": 32}
NO_BATCHING: dict[str, Any] = {"max_batch_size": 1}
# Batching is on by default only where it gives this much more at 32 clients and more at 8 without costing
# the one-client p50 more than the noise (bench/README.md): so far, multi-host replicas.
BATCH_GOAL = 1.1
OVERHEAD_GOAL_MS = 5.0
APP, BATCHED, UNBATCHED, PLAIN = "demo app", "demo app, batched", "demo app, batching off", "plain Serve app"
NO_GOAL = "none (reported)"
HEAD_RESOURCE = "node:__internal_head__"  # Ray's own resource of the head node


@dataclass
class Endpoint:
    label: str
    url: str
    body: dict[str, Any]


@dataclass
class Figures:
    """One endpoint's figures: sequential latencies (ms), requests/s and errors per client count."""

    ms: list[float] = field(default_factory=list)
    rps: dict[int, float] = field(default_factory=dict)
    errors: dict[int, int] = field(default_factory=dict)

    def p(self, q: float) -> float:
        return percentile(self.ms, q)


def _apps(hook: Any) -> dict[str, Any]:
    return hook.get_serve_details().get("applications") or {}


def _wait_running(
    hook: Any, names: list[str], timeout: float = 600, user_configs: dict[str, dict[str, Any]] | None = None
) -> None:
    """Until every app is RUNNING (and, for `user_configs`, its deployment HEALTHY with that user_config)."""
    from tpuflow.workloads.addition.pipeline import SERVE_DEPLOYMENT

    deadline = time.time() + timeout
    apps: dict[str, Any] = {}
    while time.time() < deadline:
        apps = _apps(hook)
        states = [apps.get(n, {}).get("status") for n in names]
        ready = all(s == "RUNNING" for s in states)
        for name, want in (user_configs or {}).items():
            dep = (apps.get(name, {}).get("deployments") or {}).get(SERVE_DEPLOYMENT, {})
            have = (dep.get("deployment_config") or {}).get("user_config") or {}
            ready = ready and dep.get("status") == "HEALTHY" and have == want
        if ready:
            return
        if any(s == "DEPLOY_FAILED" for s in states):
            break
        time.sleep(1)
    detail = {n: (apps.get(n, {}).get("status"), str(apps.get(n, {}).get("message"))[:300]) for n in names}
    raise RuntimeError(f"Serve apps not RUNNING within {timeout:.0f}s: {detail}")


def _sequential_ms(endpoints: list[Endpoint], n: int) -> dict[str, list[float]]:
    """`n` sequential requests to each endpoint, round robin (a request to each in turn, the order rotating),
    so that the machine's load drifting during the run weighs on every endpoint alike."""
    out: dict[str, list[float]] = {e.label: [] for e in endpoints}
    sessions = {e.label: requests.Session() for e in endpoints}
    try:
        for e in endpoints:
            for _ in range(3):
                sessions[e.label].post(e.url, json=e.body, timeout=60).raise_for_status()
        for i in range(n):
            for e in _rotated(endpoints, i):
                t = time.perf_counter()
                sessions[e.label].post(e.url, json=e.body, timeout=60).raise_for_status()
                out[e.label].append((time.perf_counter() - t) * 1000)
    finally:
        for session in sessions.values():
            session.close()
    return out


def _rotated(items: list[Any], k: int) -> list[Any]:
    k %= len(items)
    return items[k:] + items[:k]


async def _rps(url: str, body: dict[str, Any], clients: int, seconds: float) -> tuple[float, int]:
    """Requests/s answered 200 by `clients` concurrent clients, each posting back to back for `seconds`."""
    import aiohttp

    done = errors = 0
    end = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal done, errors
        while time.perf_counter() < end:
            try:
                async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=60)) as resp:
                    await resp.read()
                    if resp.status == 200:
                        done += 1
                    else:
                        errors += 1
            except (TimeoutError, aiohttp.ClientError):
                errors += 1

    t = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return done / (time.perf_counter() - t), errors


def measure_endpoints(
    ctx: Context, endpoints: list[Endpoint], n: int, seconds: float, warm_s: float, rounds: int
) -> dict[str, Figures]:
    """Warm every endpoint, then sequential latencies (round robin), then requests/s per client count:
    `rounds` windows of `seconds` per endpoint, the endpoints in turn (the order rotating), the median kept."""
    figs = {e.label: Figures() for e in endpoints}
    for e in endpoints:  # connections, and the code paths concurrency takes
        asyncio.run(_rps(e.url, e.body, max(CLIENTS), warm_s))
    for label, ms in _sequential_ms(endpoints, n).items():
        figs[label].ms = ms
    for clients in CLIENTS:
        samples: dict[str, list[tuple[float, int]]] = {e.label: [] for e in endpoints}
        for r in range(rounds):
            for e in _rotated(endpoints, r):
                samples[e.label].append(asyncio.run(_rps(e.url, e.body, clients, seconds)))
        for label, got in samples.items():
            figs[label].rps[clients] = median([rps for rps, _ in got])
            figs[label].errors[clients] = sum(errors for _, errors in got)
        ctx.log(f"  {clients:>2} client(s): " + ", ".join(f"{e.label} {figs[e.label].rps[clients]:.1f}/s"
                                                        for e in endpoints) + f"; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    return figs


def direct_ms(checkpoint: str, backend: str, n: int) -> list[float]:
    """`Predictor.complete` of the same request, in this process (load and compile left out)."""
    if str(WORKLOADS) not in sys.path:
        sys.path.insert(0, str(WORKLOADS))
    from addition.inference import Predictor

    predictor = Predictor.from_checkpoint(checkpoint, backend=backend)
    out = []
    for _ in range(n + 3):
        t = time.perf_counter()
        predictor.complete([PROMPT], max_new_tokens=4)
        out.append((time.perf_counter() - t) * 1000)
    return out[3:]


# --- configs ---------------------------------------------------------------------------------------


def renamed(app: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(app)
    out["name"], out["route_prefix"] = name, f"/{name}"
    return out


def product_app(info: dict[str, Any], checkpoint: str, name: str, serve_slice: Any = None,
                batching: bool | None = None) -> dict[str, Any]:  # fmt: skip
    """The demo app as the pipeline deploys it (serve_config_for), under `name`; `batching` True / False:
    with `BATCHING` / `NO_BATCHING` (deployment_options); None: the app's default."""
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.steps import serve_config_for

    options = None if batching is None else {"user_config": BATCHING if batching else NO_BATCHING}
    config = serve_config_for(info, {"checkpoint": checkpoint}, f"local://{WORKLOADS}", "jax", serve_slice,
                              deployment_options=options, workload=ADDITION)  # fmt: skip
    (app,) = config["applications"]
    return renamed(app, name)


def plain_app(checkpoint: str, on_head: bool = False) -> dict[str, Any]:
    """The plain app (Serve's defaults: 1 CPU, max_ongoing_requests 5). `on_head`: its replica is placed on
    the head node, as on a real cluster where TPU hosts run only the slice's work (a simulated host has 1 CPU:
    a 1-CPU replica there would leave no CPU for the slice's workers)."""
    app = {
        "name": "plain", "import_path": "jobs.plain_serve:app_builder", "route_prefix": "/plain",
        "args": {"checkpoint": checkpoint},
        "runtime_env": {"working_dir": f"local://{WORKLOADS}", "env_vars": {"PYTHONPATH": str(JOBS.parent)}},
    }  # fmt: skip
    if on_head:
        head = {"num_cpus": 1, "resources": {HEAD_RESOURCE: 0.001}}
        app["deployments"] = [{"name": "PlainCompletions", "ray_actor_options": head}]
    return app


def serve_config(info: dict[str, Any], apps: list[dict[str, Any]]) -> dict[str, Any]:
    from tpuflow.serve.config import serve_config as build

    return build(apps, http_port=info.get("serve_port"))


def endpoint(info: dict[str, Any], app: dict[str, Any], label: str) -> Endpoint:
    base = info["serve_url"]
    if app["name"] == "plain":
        return Endpoint(label, f"{base}/plain", {"prompt": PROMPT, "max_tokens": 4})
    body = {"model": app["args"]["model_name"], "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    return Endpoint(label, f"{base}{app['route_prefix']}/v1/completions", body)


# --- rows ------------------------------------------------------------------------------------------


def serve_rows(
    suffix: str,
    variant: str,
    figs: dict[str, Figures],
    direct: dict[str, list[float]],
    backend: str,
    *,
    with_goals: bool,
    where: str,
    app_batched: bool = False,
    extra: dict[str, Any] | None = None,
) -> list[Result]:
    """serve_overhead_p50_ms<suffix>, serve_rps_32<suffix> (the demo app, APP, as the pipeline deploys it)
    and serve_batched_rps_32 (variant; when the other batching setting was measured too: BATCHED if APP
    is unbatched, UNBATCHED if `app_batched`); `direct`: backend -> latencies."""
    app, plain = figs[APP], figs[PLAIN]
    on, off = (app, figs.get(UNBATCHED)) if app_batched else (figs.get(BATCHED), app)
    other = UNBATCHED if app_batched else BATCHED
    base = direct[backend]
    p50, p50_direct = app.p(50), percentile(base, 50)
    overhead = p50 - p50_direct
    labels = [x for x in (APP, BATCHED, UNBATCHED, PLAIN) if x in figs]
    pct = {f"p{q}": {**{lab: figs[lab].p(q) for lab in labels},
                     **{f"direct ({b})": percentile(v, q) for b, v in direct.items()}} for q in QS}  # fmt: skip
    rps = {lab: {str(c): figs[lab].rps.get(c) for c in CLIENTS} for lab in labels}
    errors = {lab: {str(c): figs[lab].errors.get(c) for c in CLIENTS} for lab in labels}
    common = {"where": where, "demo_app_batched": app_batched, **(extra or {})}
    over_goal = f"value <= {OVERHEAD_GOAL_MS:g} ms" if with_goals else NO_GOAL
    overhead_row = Result(
        f"serve_overhead_p50_ms{suffix}", overhead, "ms", p50_direct, ratio(p50, p50_direct), over_goal,
        goal_check(overhead, "<=", OVERHEAD_GOAL_MS) if with_goals else None, variant=variant,
        baseline_is=f"a direct in-process forward (Predictor.complete, {backend}: the app's backend) of the "
                    "same request",
        ratio_means="endpoint p50 ÷ direct forward p50",
        notes=f"{where}; {len(app.ms)} sequential POST /v1/completions; demo app p50 {p50:.2f} ms"
              + (f" ({other}: {figs[other].p(50):.2f} ms)" if other in figs else "")
              + f", plain Serve app p50 {plain.p(50):.2f} ms, direct {p50_direct:.2f} ms ("
              + ", ".join(f"{b} {percentile(v, 50):.2f} ms" for b, v in direct.items()) + ")",
        details={**common, "percentiles_ms": pct, "series_unit": "ms", "series_x": "percentile"},
        series={k: v for lab in [*labels, *(f"direct ({b})" for b in direct)]
                for k, v in ((lab, [pct[f"p{q}"][lab] for q in QS]), (f"{lab}_x", list(QS)))},
    )  # fmt: skip
    r = ratio(app.rps.get(32), plain.rps.get(32))
    rps_row = Result(
        f"serve_rps_32{suffix}", app.rps.get(32), "req/s", plain.rps.get(32), r,
        "ratio >= 1.0" if with_goals else NO_GOAL, goal_check(r, ">=", 1.0) if with_goals else None,
        variant=variant,
        baseline_is="a plain Ray Serve app (Serve defaults, numpy forward) on the same cluster, same run",
        notes=f"{where}; demo app batched: {'yes' if app_batched else 'no'}; requests/s at " + "; ".join(
            f"{c} client(s): " + ", ".join(f"{lab} {figs[lab].rps[c]:.1f}" for lab in labels) for c in CLIENTS)
              + f"; errors {errors}",
        details={**common, "rps": rps, "errors": errors, "series_unit": "req/s", "series_x": "concurrent clients"},
        series={k: v for lab in labels
                for k, v in ((lab, [figs[lab].rps[c] for c in CLIENTS]), (f"{lab}_x", list(CLIENTS)))},
    )  # fmt: skip
    rows = [overhead_row, rps_row]
    if on is not None and off is not None:
        gain = {str(c): ratio(on.rps.get(c), off.rps.get(c)) for c in CLIENTS}
        rb = gain["32"]
        rows.append(Result(
            "serve_batched_rps_32", on.rps.get(32), "req/s", off.rps.get(32), rb, f"ratio >= {BATCH_GOAL}",
            goal_check(rb, ">=", BATCH_GOAL), variant=variant or "CPU replica",
            baseline_is="the same demo app with request batching off, same cluster, same run",
            ratio_means="batched ÷ unbatched requests/s at 32 clients",
            notes=f"{where}; batching {BATCHING} ({'the default here' if app_batched else 'opt-in here'}); "
                  "batched ÷ unbatched requests/s: " + ", ".join(f"{c} client(s) {gain[str(c)]:.2f}" for c in CLIENTS)
                  + f"; one-client p50 {on.p(50):.2f} ms batched vs {off.p(50):.2f} ms",
            details={**common, "batching": BATCHING, "rps_ratio": gain,
                     "p50_ms": {"batched": on.p(50), "unbatched": off.p(50)},
                     "rps": {"batched": {str(c): on.rps.get(c) for c in CLIENTS},
                             "unbatched": {str(c): off.rps.get(c) for c in CLIENTS}}},
        ))  # fmt: skip
    return rows


def _sizes(quick: bool) -> tuple[int, float, float, int]:
    """(sequential requests per endpoint, seconds per requests/s window, warm-up seconds, windows per client
    count and endpoint)."""
    return (100, 3.0, 2.0, 2) if quick else (200, 3.0, 2.0, 2)


@measure("serve_overhead_p50_ms", produces=("serve_rps_32", "serve_batched_rps_32"))
def serve(ctx: Context) -> list[Result]:
    from tpuflow.serve.hooks import RayServeHook

    ckpt = ctx.checkpoint()
    info = ctx.cluster_info()
    hook = RayServeHook(cluster=info)
    product = product_app(info, ckpt, "addition")
    batched = product_app(info, ckpt, "addition-batched", batching=True)
    plain = plain_app(ckpt)
    n, seconds, warm, rounds = _sizes(ctx.quick)
    load = [os.getloadavg()[0]]
    hook.deploy_applications(serve_config(info, [product, batched, plain]))
    try:
        _wait_running(hook, [product["name"], batched["name"], "plain"])
        eps = [endpoint(info, product, APP), endpoint(info, batched, BATCHED), endpoint(info, plain, PLAIN)]
        figs = measure_endpoints(ctx, eps, n, seconds, warm, rounds)
    finally:
        hook.delete_applications()
    load.append(os.getloadavg()[0])
    direct = {b: direct_ms(ckpt, b, n) for b in ("jax", "numpy")}  # the app's backend is the framework's: jax
    where = "the shared head-only cluster: CPU replicas"
    return serve_rows("", "", figs, direct, "jax", with_goals=True, where=where,
                      extra={"load_1min_before_after": load})  # fmt: skip


# Nine minutes on 2 cores (three deployments, 1/8/32 clients each): make bench-serving, not make bench.
@measure(
    "serve_rps_32_multi_host",
    full=False,
    produces=("serve_overhead_p50_ms_multi_host", "serve_overhead_p50_ms_single_host_tpu", "serve_rps_32_single_host_tpu"),
)  # fmt: skip
def serve_on_slices(ctx: Context) -> list[Result]:
    from tpuflow.workloads.addition.pipeline import SERVE_DEPLOYMENT

    from tpuflow.local.cluster import LocalRayCluster
    from tpuflow.pipeline.params import local_serve_slice
    from tpuflow.serve.hooks import RayServeHook
    from tpuflow.tpu import TpuSlice

    ckpt = ctx.checkpoint()
    n, seconds, warm, rounds = _sizes(ctx.quick)
    tpu = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t")
    single = local_serve_slice(tpu, None)  # the pipeline's default: one host's shape (v6e 2x2), on either host
    t = time.perf_counter()
    cluster = LocalRayCluster.start(tpu, "bench-serve", ctx.work / "clusters-serve", timeout=600)
    ctx.log(f"v6e 2x4 cluster (head + {tpu.total_hosts} hosts) up in {time.perf_counter() - t:.0f}s")
    rows: list[Result] = []
    try:
        info = cluster.connection_info()
        hook = RayServeHook(cluster=info)
        plain = plain_app(ckpt, on_head=True)
        direct = {b: direct_ms(ckpt, b, n) for b in ("jax", "numpy")}
        # 1. one replica over the whole slice, as deployed (batched), then batching off (the same replica,
        # reconfigured through its user_config)
        multi = product_app(info, ckpt, "addition-mh", tpu.to_dict())
        load = [os.getloadavg()[0]]
        t = time.perf_counter()
        hook.deploy_applications(serve_config(info, [multi, plain]))
        _wait_running(hook, [multi["name"], "plain"])
        deploy_s = time.perf_counter() - t
        ctx.log(f"multi-host replica RUNNING in {deploy_s:.0f}s")
        eps = [endpoint(info, multi, APP), endpoint(info, plain, PLAIN)]
        figs = measure_endpoints(ctx, eps, n, seconds, warm, rounds)
        multi_off = product_app(info, ckpt, "addition-mh", tpu.to_dict(), batching=False)
        hook.deploy_applications(serve_config(info, [multi_off, plain]))
        _wait_running(hook, [multi["name"], "plain"], user_configs={multi["name"]: NO_BATCHING})
        assert multi_off["deployments"][0]["name"] == SERVE_DEPLOYMENT
        eps = [endpoint(info, multi, UNBATCHED), endpoint(info, plain, PLAIN)]
        control = measure_endpoints(ctx, eps, n, seconds, warm, rounds)
        figs[UNBATCHED] = control[UNBATCHED]
        load.append(os.getloadavg()[0])
        rows += serve_rows("_multi_host", "v6e 2x4, 2 hosts", figs, direct, "jax", with_goals=False, app_batched=True,
                           where="one replica spanning a simulated v6e 2x4 slice (2 hosts x 4 chips, JAX on CPU)",
                           extra={"load_1min_before_after": load, "deploy_s": round(deploy_s, 1),
                                  "unbatched_measured": "after the demo app's figures, the same replica reconfigured",
                                  "plain_rps_while_unbatched": {str(c): control[PLAIN].rps[c] for c in CLIENTS}})  # fmt: skip
        # 2. single-host replicas (each holds one host's TPU), batching off and on side by side
        host_app = product_app(info, ckpt, "addition-1h", single.to_dict())
        host_batched = product_app(info, ckpt, "addition-1h-batched", single.to_dict(), batching=True)
        load = [os.getloadavg()[0]]
        t = time.perf_counter()
        hook.deploy_applications(serve_config(info, [host_app, host_batched, plain]))
        _wait_running(hook, [host_app["name"], host_batched["name"], "plain"])
        deploy_s = time.perf_counter() - t
        eps = [endpoint(info, host_app, APP), endpoint(info, host_batched, BATCHED), endpoint(info, plain, PLAIN)]
        figs = measure_endpoints(ctx, eps, n, seconds, warm, rounds)
        load.append(os.getloadavg()[0])
        rows += serve_rows("_single_host_tpu", f"v6e {single.topology}, 1 host", figs, direct, "jax",
                           with_goals=False, where=f"replicas each holding one simulated v6e host's TPU "
                                                   f"({single.topology}, {single.chips_per_host} chips; JAX on CPU)",
                           extra={"load_1min_before_after": load, "deploy_s": round(deploy_s, 1)})  # fmt: skip
    finally:
        cluster.stop()
    return rows
