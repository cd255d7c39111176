"""serve_overhead_p50_ms / serve_rps_32: the demo's Serve app (workloads/addition/serve_app.py, deployed
with the pipeline's own config) vs a plain Ray Serve app on the same cluster, and a direct in-process
forward of the same request as the latency baseline."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import requests

from bench.core import JOBS, WORKLOADS, Context, Result, goal_check, measure, percentile, ratio

PROMPT = "17+25="


def _wait_running(hook: Any, names: list[str], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    apps: dict[str, Any] = {}
    while time.time() < deadline:
        apps = hook.get_serve_applications().get("applications", {})
        states = [apps.get(n, {}).get("status") for n in names]
        if all(s == "RUNNING" for s in states):
            return
        if any(s == "DEPLOY_FAILED" for s in states):
            break
        time.sleep(1)
    raise RuntimeError(f"Serve apps not RUNNING: { {n: apps.get(n, {}).get('status') for n in names} }")


def _sequential_ms(url: str, body: dict[str, Any], n: int) -> list[float]:
    out = []
    with requests.Session() as s:
        for _ in range(3):
            s.post(url, json=body, timeout=30).raise_for_status()
        for _ in range(n):
            t = time.perf_counter()
            s.post(url, json=body, timeout=30).raise_for_status()
            out.append((time.perf_counter() - t) * 1000)
    return out


async def _rps(url: str, body: dict[str, Any], clients: int, seconds: float) -> tuple[float, int]:
    import aiohttp

    done = errors = 0
    end = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal done, errors
        while time.perf_counter() < end:
            try:
                async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as resp:
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


@measure("serve_overhead_p50_ms", produces=("serve_rps_32",))
def serve(ctx: Context) -> list[Result]:
    from tpuflow.pipeline.steps import serve_config_for

    if str(WORKLOADS) not in sys.path:
        sys.path.insert(0, str(WORKLOADS))
    from addition.inference import Predictor

    ckpt = ctx.checkpoint()
    info = ctx.cluster_info()
    hook = ctx.hook()
    # as the pipeline deploys it: Serve configs take local:// URIs for directories on every node
    config = serve_config_for(info, {"checkpoint": ckpt}, f"local://{WORKLOADS}", "jax")
    product_app = config["applications"][0]
    config["applications"].append({
        "name": "plain", "import_path": "jobs.plain_serve:app_builder", "route_prefix": "/plain",
        "args": {"checkpoint": ckpt},
        "runtime_env": {"working_dir": f"local://{WORKLOADS}", "env_vars": {"PYTHONPATH": str(JOBS.parent)}},
    })  # fmt: skip
    hook.put_serve_config(config)
    n, seconds = (100, 6) if ctx.quick else (300, 15)
    try:
        _wait_running(hook, [product_app["name"], "plain"])
        base = info["serve_url"]
        product_url = f"{base}{product_app['route_prefix']}/v1/completions"
        product_body = {"model": product_app["args"]["model_name"], "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        plain_url, plain_body = f"{base}/plain", {"prompt": PROMPT, "max_tokens": 4}
        product_ms = _sequential_ms(product_url, product_body, n)
        plain_ms = _sequential_ms(plain_url, plain_body, n)
        product_rps, product_err = asyncio.run(_rps(product_url, product_body, 32, seconds))
        plain_rps, plain_err = asyncio.run(_rps(plain_url, plain_body, 32, seconds))
    finally:
        hook.delete_serve_applications()
    predictor = Predictor.from_checkpoint(ckpt)  # numpy: the app's default backend
    direct_ms = []
    for _ in range(n + 3):
        t = time.perf_counter()
        predictor.complete([PROMPT], max_new_tokens=4)
        direct_ms.append((time.perf_counter() - t) * 1000)
    direct_ms = direct_ms[3:]
    p50, p50_plain, p50_direct = (percentile(x, 50) for x in (product_ms, plain_ms, direct_ms))
    overhead = p50 - p50_direct
    qs = [50, 90, 95, 99]
    pct = {f"p{q}": {"app": percentile(product_ms, q), "plain": percentile(plain_ms, q), "direct": percentile(direct_ms, q)}
           for q in qs}  # fmt: skip
    r = ratio(product_rps, plain_rps)
    return [
        Result(
            "serve_overhead_p50_ms", overhead, "ms", p50_direct, ratio(p50, p50_direct), "value <= 5 ms",
            goal_check(overhead, "<=", 5.0),
            baseline_is="a direct in-process forward (Predictor.complete, numpy) of the same request",
            ratio_means="endpoint p50 ÷ direct forward p50",
            notes=f"{n} sequential POST /v1/completions; endpoint p50 {p50:.2f} ms, plain Serve app p50 "
                  f"{p50_plain:.2f} ms, direct {p50_direct:.2f} ms",
            details={"percentiles_ms": pct, "series_unit": "ms", "series_x": "percentile"},
            series={"demo app": [pct[f"p{q}"]["app"] for q in qs], "demo app_x": qs,
                    "plain Serve app": [pct[f"p{q}"]["plain"] for q in qs], "plain Serve app_x": qs,
                    "direct forward": [pct[f"p{q}"]["direct"] for q in qs], "direct forward_x": qs},
        ),
        Result(
            "serve_rps_32", product_rps, "req/s", plain_rps, r, "ratio >= 1.0", goal_check(r, ">=", 1.0),
            baseline_is="a plain Ray Serve app (Serve defaults) with the same forward, same cluster, same run",
            notes=f"32 concurrent aiohttp clients for {seconds} s each; errors: app {product_err}, plain {plain_err}",
            details={"errors": {"app": product_err, "plain": plain_err}},
        ),
    ]  # fmt: skip
