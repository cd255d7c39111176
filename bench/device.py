"""`python -m bench --device`: the rows measured on a TPU chip (issue 49), written to bench/results/device.json.

Each row runs `bench.device_rows` in a child process (the chip belongs to one process at a time; this one
never imports jax). Without a TPU every row is skipped, with the reason; TPUFLOW_BENCH_DEVICE_ALLOW_CPU=1
runs them on whatever jax finds, and TPUFLOW_BENCH_DEVICE_SIZE=tiny shrinks them (the CPU test does both).
TPUFLOW_BENCH_CKPT_DIR: where checkpoint_on_notice_s writes (default: the temp dir; never $OUT, whose
files travel back).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.core import REPO, WORKLOADS, Context, Result, goal_check, measure, ratio

ALLOW_CPU_ENV = "TPUFLOW_BENCH_DEVICE_ALLOW_CPU"
SIZE_ENV = "TPUFLOW_BENCH_DEVICE_SIZE"
CKPT_DIR_ENV = "TPUFLOW_BENCH_CKPT_DIR"
ROW_TIMEOUT_S = 540

_PROBE = """
import json, jax
from importlib import metadata
def v(d):
    try:
        return metadata.version(d)
    except metadata.PackageNotFoundError:
        return None
d = jax.devices()
print(json.dumps({"platform": d[0].platform, "device_kind": d[0].device_kind, "device_count": len(d),
                  "jax": jax.__version__, "jaxlib": v("jaxlib"), "libtpu": v("libtpu") or v("libtpu-nightly")}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(WORKLOADS), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def chip() -> dict[str, Any]:
    """What jax finds in a child process; ``skip`` says why the rows cannot run here (None: they can)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=_env())
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"skip": f"no jax device: {err}"}
    if done.returncode:
        return {"skip": f"no jax device: {done.stderr.strip().splitlines()[-1:] or done.returncode}"}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    allowed = os.environ.get(ALLOW_CPU_ENV) == "1"
    found["skip"] = None if found["platform"] == "tpu" or allowed else f"no TPU: jax found {found['platform']}"
    return found


def _size() -> str:
    return os.environ.get(SIZE_ENV, "chip")


def _row(ctx: Context, row: str, extra: str | None = None) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="tpuflow-device-")) / "row.json"
    env = _env()
    env["TPUFLOW_BENCH_T0"] = repr(time.time())
    if _size() == "tiny":
        env.setdefault("TPUFLOW_COMPILATION_CACHE_MIN_COMPILE_S", "0")  # CPU programs compile in well under 1 s
    cmd = [sys.executable, "-m", "bench.device_rows", row, _size(), str(out), *([extra] if extra else [])]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=ROW_TIMEOUT_S, env=env, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{row} exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    data = json.loads(out.read_text())
    data["process_s"] = round(time.perf_counter() - t, 2)
    ctx.log(f"device row {row}: {data['process_s']} s")
    return data


def _skipped(name: str, unit: str, goal: str, reason: str) -> list[Result]:
    return [Result(name, None, unit, None, None, goal, None, notes=f"skipped: {reason}")]


def _chip(ctx: Context) -> dict[str, Any]:
    if "chip" not in ctx.shared:
        ctx.shared["chip"] = chip()
    return ctx.shared["chip"]


@measure("device_train_step_ratio", quick=False, full=False, device=True)
def device_train_step_ratio(ctx: Context) -> list[Result]:
    goal = "<= 1.02"
    if reason := _chip(ctx)["skip"]:
        return _skipped("device_train_step_ratio", "x", goal, reason)
    d = _row(ctx, "ratio")
    return [Result("device_train_step_ratio", d["fit_ms_per_step"], "ms/step", d["bare_ms_per_step"], d["value"],
                   goal, goal_check(d["value"], "<=", 1.02),
                   baseline_is="a bare loop over the same jitted step (the demo's DataParallelState.step) and the "
                               "same device batches, loss fetched once at the end",
                   ratio_means="median over repetitions of (addition.training.fit with its StepClock, logging "
                               "and loss fetch every log_every) / (bare loop), both warm, the six orders of (fit, bare, "
                               "bare again) in turn; details.noise_floor: bare loop / bare loop in the same repetitions",
                   details=d)]  # fmt: skip


@measure("device_model_step", quick=False, full=False, device=True, produces=("device_model_mfu",))
def device_model_step(ctx: Context) -> list[Result]:
    if reason := _chip(ctx)["skip"]:
        return [*_skipped("device_model_step", "ms", "reported", reason),
                *_skipped("device_model_mfu", "fraction", "reported", reason)]  # fmt: skip
    d = _row(ctx, "mfu")
    mfu = d["mfu_xla"] if d["mfu_xla"] is not None else d["mfu_shape"]
    what = f"{d['params'] / 1e6:.0f} M parameters ({d['model']}), batch {d['batch']} x {d['tokens_per_step'] // d['batch']} tokens"
    return [
        Result("device_model_step", d["value"], "ms", None, None, "reported", None,
               notes=f"the demo architecture at {what}; float32 master weights, forward and backward in bfloat16, "
                     "AdamW (bench.device_model); median of warm steps", details=d),
        Result("device_model_mfu", mfu, "fraction", d["peak_flops"], None, "reported", None,
               baseline_is="the chip's bf16 peak (FLOP/s; v5e: 197e12)",
               ratio_means="value: step FLOPs (XLA's cost analysis; the shape count in details) / step time / peak",
               details={k: d[k] for k in ("flops_shape", "flops_xla", "mfu_shape", "mfu_xla", "device_kind")}),
    ]  # fmt: skip


@measure("time_to_first_step_s", quick=False, full=False, device=True)
def time_to_first_step_s(ctx: Context) -> list[Result]:
    goal = "warm <= 0.5 x cold"
    if reason := _chip(ctx)["skip"]:
        return _skipped("time_to_first_step_s", "s", goal, reason)
    from bench.device_rows import SIZES

    rows = []
    for model in SIZES[_size()]["first"]:
        cold, warm, compile_cold, compile_warm, runs = [], [], [], [], []
        for _ in range(2 if model == "demo" else 1):
            cache = tempfile.mkdtemp(prefix="tpuflow-jax-cache-")
            for bucket, comp in ((cold, compile_cold), (warm, compile_warm)):
                d = _row(ctx, f"first:{model}", cache)
                bucket.append(d["to_first_step_s"])
                comp.append(d["compile_s"])
                runs.append(d)
        c, w = statistics.median(cold), statistics.median(warm)
        r = ratio(w, c)
        rows.append(Result("time_to_first_step_s", w, "s", c, r, goal, goal_check(r, "<=", 0.5), variant=model,
                           baseline_is="the same fresh process with an empty cache folder (cold)",
                           ratio_means="warm / cold: process start to the first step done, each in a fresh process, "
                                       "the cache turned on by the driver's tpuflow_driver.compile_cache.enable",
                           details={"cold_s": cold, "warm_s": warm, "compile_cause_cold_s": compile_cold,
                                    "compile_cause_warm_s": compile_warm, "runs": runs}))  # fmt: skip
    return rows


@measure("checkpoint_on_notice_s", quick=False, full=False, device=True)
def checkpoint_on_notice_s(ctx: Context) -> list[Result]:
    goal = "p99 <= 10 s, restore bit-exact"
    if reason := _chip(ctx)["skip"]:
        return _skipped("checkpoint_on_notice_s", "s", goal, reason)
    d = _row(ctx, "ckpt", os.environ.get(CKPT_DIR_ENV) or tempfile.gettempdir())
    met = goal_check(d["p99"], "<=", 10.0)
    return [Result("checkpoint_on_notice_s", d["p99"], "s", d["raw_write_s"], ratio(d["p50"], d["raw_write_s"]), goal,
                   None if met is None else met and bool(d["restore_bit_exact"]),
                   baseline_is="the disk's own speed for the same bytes: every array fetched, one file written and "
                               "fsync'd, beside each notice's save in alternating order (median)",
                   ratio_means="p50 of the driver's save (DataParallelState.save: np.savez, fsync) / p50 of the raw "
                               "write; value is the p99 over the notices",
                   notes=f"state {d['state_bytes'] / 1e9:.2f} GB (parameters + AdamW moments), {d['n']} notices",
                   details=d)]  # fmt: skip


@measure("serve_forward_ms", quick=False, full=False, device=True)
def serve_forward_ms(ctx: Context) -> list[Result]:
    if reason := _chip(ctx)["skip"]:
        return _skipped("serve_forward_ms", "ms", "reported", reason)
    d = _row(ctx, "serve")
    return [Result("serve_forward_ms", d[f"batch_{b}"]["p50"], "ms", None, None, "reported", None, variant=f"batch {b}",
                   notes=f"p99 {d[f'batch_{b}']['p99']:.2f} ms; Predictor.complete (the Serve app's decoder, jax "
                         "backend, greedy decode of the demo model) without Ray Serve",
                   details=d[f"batch_{b}"]) for b in (1, 32)]  # fmt: skip
