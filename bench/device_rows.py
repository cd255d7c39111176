"""The chip rows, each run in its own process: ``python -m bench.device_rows ROW SIZE OUT_JSON [CACHE_DIR]``.

One process per row because a TPU is held by the process that first opens it: the bench's own process never
imports jax, and `time_to_first_step_s` needs fresh processes anyway. SIZE is "chip" (the sizes in the issue)
or "tiny" (the CPU test: every row's code path, seconds each). Only the standard library, numpy, jax and the
project's own modules are imported (no Ray, pyarrow or optax: see bench.device_model).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

T0_ENV = "TPUFLOW_BENCH_T0"  # the parent's time.time() just before it started this process
PEAK_BF16_FLOPS = {"TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v6 lite": 918e12, "TPU v5p": 459e12}

SIZES: dict[str, dict[str, Any]] = {
    "chip": {
        "ratio": {"steps": 500, "reps": 18, "batch": 128},
        "mfu": {"model": {"d_model": 1024, "n_heads": 16, "n_layers": 16, "d_ff": 4096}, "batch": 2048, "steps": 20},
        "first": {"demo": {}, "25m": {"d_model": 512, "n_heads": 8, "n_layers": 8, "d_ff": 2048}},
        "ckpt": {"model": {"d_model": 1536, "n_heads": 12, "n_layers": 12, "d_ff": 6144}, "notices": 10},
        "serve": {"calls": 50},
    },
    "tiny": {
        "ratio": {"steps": 20, "reps": 2, "batch": 16},
        "mfu": {"model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64}, "batch": 16, "steps": 3},
        "first": {"demo": {}},
        "ckpt": {"model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64}, "notices": 3},
        "serve": {"calls": 3},
    },
}


# main's own moments (time.time()), for time_to_first_step_s's phases
_MARKS: dict[str, float] = {}


def _tokens(n: int) -> np.ndarray:
    from addition.data import generate

    return generate("2026-01-01", "train", n, num_heldout=200)["tokens"].astype(np.int32)


def _state(cfg: dict[str, Any]) -> Any:
    from addition.model_jax import init_params
    from addition.train_jax import DataParallelState
    from addition.training import model_config

    from bench.device_model import AdamW

    return DataParallelState(cfg, init_params(model_config(cfg)[1], 0), optimizer=AdamW(lr=1e-3))


def _pct(values: list[float]) -> dict[str, float]:
    from bench.core import percentile

    return {"p50": statistics.median(values), "p99": percentile(values, 99), "n": len(values)}


def train_step_ratio(size: dict[str, Any]) -> dict[str, Any]:
    """The project's fit loop (StepClock, logging, loss fetched every log_every) vs a bare loop, same step and batches."""
    from addition.training import fit, resolve_config

    steps, bsz = int(size["steps"]), int(size["batch"])
    cfg = resolve_config({"num_steps": steps, "global_batch_size": bsz, "log_every": 100})
    state = _state(cfg)
    rows = _tokens(steps * bsz)
    batches = [state.global_batch(rows[i * bsz : (i + 1) * bsz]) for i in range(steps)]
    logs: list[str] = []

    def fit_loop() -> None:
        fit(state.step, state.fetch_float, cfg, lambda _epoch: iter(batches), log=logs.append, prefetch=state.prefetch)

    def bare() -> None:
        loss = None
        for b in batches:
            loss = state.step(b)
        state.fetch_float(loss)

    # Both sides run once untimed (the step is compiled, and fit's own first call is not "warm"). Each repetition
    # then times fit, the bare loop and the bare loop again in one of the six orders, the orders taken in turn: a
    # slot charges its run (on the chip the first of a repetition ran up to 1 % slower), and a side kept in one
    # slot (the bare loop always in the middle, as before) read that slot's charge as fit's overhead or saving. Bare against bare
    # is the noise floor the ratio is read against.
    bare()
    fit_loop()
    sides = {"fit": fit_loop, "bare": bare, "bare again": bare}
    orders = list(itertools.permutations(sides))
    fit_s, bare_s, floor = [], [], []
    for rep in range(int(size["reps"])):
        timed: dict[str, float] = {}
        for side in orders[rep % len(orders)]:
            t = time.perf_counter()
            sides[side]()
            timed[side] = time.perf_counter() - t
        fit_s.append(timed["fit"])
        bare_s.append(timed["bare"])
        floor.append(timed["bare again"] / timed["bare"])
    ratios = [f / b for f, b in zip(fit_s, bare_s, strict=True)]
    return {
        "value": statistics.median(ratios),
        "fit_ms_per_step": statistics.median(fit_s) / steps * 1e3,
        "bare_ms_per_step": statistics.median(bare_s) / steps * 1e3,
        "ratios": ratios,
        "noise_floor": {"median": statistics.median(floor), "min": min(floor), "max": max(floor)},
        "steps": steps,
        "batch": bsz,
    }


def model_mfu(size: dict[str, Any], device_kind: str) -> dict[str, Any]:
    import jax
    from addition.data import TaskSpec, loss_mask
    from addition.model_jax import ModelConfig, init_params

    from bench.device_model import AdamW, mixed_step, model_flops, param_count, xla_flops

    spec = TaskSpec()
    cfg = ModelConfig(seq_len=spec.seq_len, **size["model"])
    bsz, steps = int(size["batch"]), int(size["steps"])
    opt = AdamW()
    params = {k: jax.device_put(v) for k, v in init_params(cfg, 0).items()}
    opt_state = opt.init(params)
    tokens = jax.device_put(_tokens(bsz))
    step = mixed_step(cfg, opt, loss_mask(spec))
    t = time.perf_counter()
    compiled = step.lower(params, opt_state, tokens).compile()
    compile_s = time.perf_counter() - t
    params, opt_state, loss = compiled(params, opt_state, tokens)
    float(loss)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, tokens)
        float(loss)
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    t_in = spec.seq_len - 1
    shape_flops, xla = model_flops(cfg, bsz, t_in), xla_flops(compiled)
    peak = PEAK_BF16_FLOPS.get(device_kind)
    return {
        "value": step_s * 1e3,
        "params": param_count(cfg),
        "model": cfg.to_dict(),
        "batch": bsz,
        "tokens_per_step": bsz * t_in,
        "compile_s": compile_s,
        "flops_shape": shape_flops,
        "flops_xla": xla,
        "peak_flops": peak,
        "mfu_shape": shape_flops / step_s / peak if peak else None,
        "mfu_xla": xla / step_s / peak if peak and xla else None,
        "loss": float(loss),
    }


def first_step(model: dict[str, Any], cache: str | None) -> dict[str, Any]:
    """Process start -> first step, with the driver's compilation cache turned on in ``cache`` (None: off)."""
    from tpuflow_driver.compile_cache import enable

    folder = enable(cache) if cache else None
    from addition.training import fit, resolve_config
    from tpuflow_driver.goodput import StepClock

    cfg = resolve_config({"num_steps": 3, "global_batch_size": 32, "model": model})
    marks = {**_MARKS, "cache_and_imports": time.time()}
    state = _state(cfg)
    marks["state_init"] = time.time()
    rows = _tokens(3 * 32)
    marks["data"] = time.time()
    clock = StepClock()
    fit(state.step, state.fetch_float, cfg, lambda _e: iter(state.global_batch(rows[i * 32 : (i + 1) * 32])
                                                              for i in range(3)), clock=clock, log=lambda _m: None)  # fmt: skip
    started = float(os.environ.get(T0_ENV, clock.began_at))
    first_done = clock.began_at + sum(clock.seconds[c] for c in ("startup", "data_wait", "compile"))
    # the profile: where process start -> first step went, phase by phase (the first step: trace, compile or
    # cache read, run)
    edges = [("python_start", started), *marks.items(), ("first_step", first_done)]
    return {
        "to_first_step_s": first_done - started,
        "phases_s": {name: round(t - prev, 4) for (_, prev), (name, t) in zip(edges, edges[1:], strict=False)},
        "compile_s": clock.seconds["compile"],
        "cache_folder": folder,
        "cache_files": sum(1 for _ in Path(folder).rglob("*") if _.is_file()) if folder else 0,
    }


def checkpoint_on_notice(size: dict[str, Any], where: str) -> dict[str, Any]:
    """From a preemption notice to a durable checkpoint (the loop's save, fsync'd), then a bit-exact restore."""
    import jax
    from addition.train_jax import restore
    from addition.training import resolve_config
    from tpuflow_driver.preemption import PreemptionNotice

    cfg = resolve_config({"model": size["model"]})
    state = _state(cfg)
    # optimizer moments unlike the parameters and each other, so a mixed-up restore cannot pass
    state.opt_state = jax.jit(lambda s, p: s._replace(mu=jax.tree.map(lambda x: x * 0.5, p),
                                                      nu=jax.tree.map(lambda x: x * x, p)))(state.opt_state, state.params)  # fmt: skip
    leaves = [*state.params.values(), *jax.tree_util.tree_leaves(state.opt_state)]
    state_bytes = sum(x.nbytes for x in leaves)
    root = Path(tempfile.mkdtemp(prefix="tpuflow-ckpt-bench-", dir=where))
    seconds: list[float] = []
    raw_seconds: list[float] = []
    names = list(state.params)

    def raw_write(path: Path) -> None:
        """The disk's own speed for these bytes: every array fetched to the host, one file written, fsync'd."""
        with open(path, "wb") as fh:
            for x in leaves:
                fh.write(memoryview(np.ascontiguousarray(x.addressable_data(0))).cast("B"))
            fh.flush()
            os.fsync(fh.fileno())

    try:
        # side by side: each notice's save and a raw write of its bytes, in alternating order (the disk drifts)
        for i in range(int(size["notices"])):
            target, raw = root / f"n{i}", root / f"raw{i}"
            for which in ("new", "raw") if i % 2 == 0 else ("raw", "new"):
                t = time.perf_counter()
                if which == "new":
                    notice = PreemptionNotice(get_info=lambda: {"deadline_ms": None})
                    if notice.arrived():
                        state.save(target, i, 0)
                    seconds.append(time.perf_counter() - t)
                else:
                    raw_write(raw)
                    raw_seconds.append(time.perf_counter() - t)
                    raw.unlink()
            if i + 1 < int(size["notices"]):
                shutil.rmtree(target)
        last = root / f"n{int(size['notices']) - 1}"
        host = [np.asarray(x.addressable_data(0)) for x in leaves]
        t = time.perf_counter()
        params, opt_leaves, meta = restore(last, cfg)
        restore_s = time.perf_counter() - t
        exact = all(np.array_equal(a, b) for a, b in zip([*(params[k] for k in names), *opt_leaves], host, strict=True))
        del params, opt_leaves, host
        shutil.rmtree(last)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        **_pct(seconds),
        "seconds": seconds,
        "state_bytes": state_bytes,
        "raw_write_s": statistics.median(raw_seconds),
        "raw_write_seconds": raw_seconds,
        "restore_s": restore_s,
        "restore_bit_exact": exact,
        "restored_step": meta.step,
        "folder": where,
    }


def serve_forward(size: dict[str, Any]) -> dict[str, Any]:
    """The Serve app's decoder (`Predictor`, jax backend: what a replica's `complete` runs), no Ray Serve."""
    from addition import checkpoint as ckpt
    from addition.data import TaskSpec, generate
    from addition.inference import Predictor
    from addition.model_jax import ModelConfig, init_params

    spec = TaskSpec()
    model = ModelConfig(seq_len=spec.seq_len)
    predictor = Predictor(init_params(model, 0), ckpt.Meta("jax", 0, 0, model, spec), backend="jax")
    prompts = [str(p) for p in generate("2026-01-01", "heldout", 64, num_heldout=200)["prompt"]]
    out: dict[str, Any] = {}
    for batch in (1, 32):
        for _ in range(2):  # compiled for this batch's shapes before timing
            predictor.complete(prompts[:batch])
        times = []
        for i in range(int(size["calls"])):
            chunk = [prompts[(i + j) % len(prompts)] for j in range(batch)]
            t = time.perf_counter()
            predictor.complete(chunk)
            times.append((time.perf_counter() - t) * 1e3)
        out[f"batch_{batch}"] = _pct(times)
    return out


def main(argv: list[str]) -> None:
    row, size_name, out = argv[0], argv[1], Path(argv[2])
    extra = argv[3] if len(argv) > 3 else None
    size = SIZES[size_name]
    _MARKS["python_start"] = time.time()
    import jax

    _MARKS["jax_import"] = time.time()
    kind = jax.devices()[0].device_kind
    _MARKS["backend_init"] = time.time()
    if row == "ratio":
        result = train_step_ratio(size["ratio"])
    elif row == "mfu":
        result = model_mfu(size["mfu"], kind)
    elif row.startswith("first:"):
        result = first_step(size["first"][row.split(":", 1)[1]], extra or None)
    elif row == "ckpt":
        result = checkpoint_on_notice(size["ckpt"], extra or tempfile.gettempdir())
    elif row == "serve":
        result = serve_forward(size["serve"])
    else:
        raise SystemExit(f"unknown row {row!r}")
    out.write_text(json.dumps({"device_kind": kind, **result}, default=float))


if __name__ == "__main__":
    main(sys.argv[1:])
