"""The addition workload's fixed costs and overheads, each against a same-run baseline.

eval_examples_per_s — the held-out evaluation by the training workers after their last step (the local
pipeline's) vs an in-process forward of the same 200 problems (forward built and compiled on both sides;
the in-process side loads the checkpoint too); the separate evaluate job in details.
train_step_ratio — ms/step of the product's JaxTrainer (and TorchTrainer) run vs the same step in a plain
jax.distributed (torch.distributed) loop with the same processes and batch: plain ÷ Ray Train (goal >= 0.8).
input_feed_overhead — step time fed by Ray Data iter_jax_batches ÷ step time on preloaded arrays, minus 1.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from bench.core import (
    DATE,
    JOBS,
    WORKLOADS,
    Context,
    Result,
    goal_check,
    measure,
    median,
    ratio,
    spawned,
)  # fmt: skip

EVAL_GOAL = 0.5  # of the in-process forward's rate (issue 28; the separate job's goal was 0.25)
STEP_LINE = re.compile(r"step (\d+)/\d+ .*\(([\d.]+) ms/step\)")


def _workloads_path() -> None:
    if str(WORKLOADS) not in sys.path:
        sys.path.insert(0, str(WORKLOADS))


@measure("eval_examples_per_s")
def eval_examples_per_s(ctx: Context) -> list[Result]:
    """The held-out evaluation as the local pipeline runs it: by the JaxTrainer's workers after their last
    step (addition.heldout, the demo's Workload.evaluate_in_training), against an in-process forward; the
    separate evaluate job (what the pipeline ran before, and the GKE DAG still runs on its CPU cluster) side
    by side in the same run."""
    import pyarrow.parquet as pq

    from tpuflow.rayjob.hooks import parse_result

    _workloads_path()
    data, ckpt = ctx.data(), ctx.checkpoint()
    # trained far enough that its answers are the trained model's (an untrained one stops early: less work)
    steps = 600
    config = {"num_steps": steps, "checkpoint_every": steps, "log_every": 100, "heldout": data["heldout"]}
    logs = _train_job(ctx, data, "jax", "eval-in-training", 2, config)
    in_training = (parse_result(logs) or {}).get("evaluation") or {}
    if not in_training.get("n"):
        raise RuntimeError(f"the training reported no evaluation:\n{logs[-3000:]}")
    n, eval_s = int(in_training["n"]), float(in_training["eval_seconds"])

    wall = time.perf_counter()
    info, job_logs = ctx.run_job(
        f"python -m addition.evaluate --checkpoint {ckpt} --framework jax --data {data['heldout']}", name="eval"
    )
    wall = time.perf_counter() - wall
    job = parse_result(job_logs)
    job_s = (info["end_time"] - info["start_time"]) / 1000
    # where the job's time goes: the same entrypoint under cProfile (driver side), with --profile
    where: dict[str, float] = {}
    if ctx.profile:
        prof = ctx.work / "eval.prof"
        ctx.run_job(f"python -m cProfile -o {prof} -m addition.evaluate --checkpoint {ckpt} --framework jax "
                    f"--data {data['heldout']}", name="eval-prof")  # fmt: skip
        import pstats

        stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
        for (_f, _l, fn), (_cc, _nc, _tt, ct, _c) in stats.items():
            for want in ("init", "read_parquet", "take_all", "<module>", "evaluate", "local_copy", "load_meta"):
                if fn == want and ct > 0.05:
                    where[want] = round(max(where.get(want, 0.0), ct), 2)
    from addition.inference import Predictor

    held = pq.read_table(data["heldout"], columns=["prompt", "answer"]).to_pydict()
    t = time.perf_counter()
    predictor = Predictor.from_checkpoint(ckpt, backend="jax")
    outs = []
    for i in range(0, len(held["prompt"]), 256):
        outs += predictor.complete(held["prompt"][i : i + 256])
    direct_s = time.perf_counter() - t
    correct = sum(o.text == a for o, a in zip(outs, held["answer"], strict=True))
    value, base = n / eval_s, len(outs) / direct_s
    job_rate = int(job["n"]) / job_s
    r = ratio(value, base)
    return [Result(
        "eval_examples_per_s", value, "examples/s", base, r, f"ratio >= {EVAL_GOAL}", goal_check(r, ">=", EVAL_GOAL),
        baseline_is="in-process Predictor.from_checkpoint(backend=jax).complete over the same problems, load included",
        notes=f"{n} problems answered by the 2 JaxTrainer workers after their last step ({steps} steps), the "
              f"forward built and compiled there: {eval_s:.2f} s, accuracy {in_training.get('accuracy')}; "
              f"in-process {direct_s:.2f} s, accuracy {correct / len(outs):.3f}; the separate evaluate job (Ray "
              f"Data, one actor) {job_s:.1f} s by Ray's own start/end times ({wall:.1f} s submit to done), "
              f"{job_rate:.1f} examples/s = {ratio(job_rate, base):.3g}x"
              + (f"; job driver profile (cumulative s): {where}" if where else ""),
        details={"in_training_eval_s": eval_s, "in_training_accuracy": in_training.get("accuracy"),
                 "direct_s": direct_s, "separate_job_s": job_s, "separate_job_submit_to_done_s": wall,
                 "separate_job_examples_per_s": job_rate, "separate_job_ratio": ratio(job_rate, base),
                 "job_driver_profile_s": where},
    )]  # fmt: skip


def _step_times(logs: str) -> tuple[list[int], list[float]]:
    steps, ms = [], []
    for line in logs.splitlines():
        m = STEP_LINE.search(line)
        if m:
            steps.append(int(m.group(1)))
            ms.append(float(m.group(2)))
    return steps, ms


def _steady(ms: list[float]) -> float | None:
    """Median ms/step over the logged windows after the first (which holds the compile)."""
    return median(ms[1:]) if len(ms) > 1 else None


def _train_job(ctx: Context, data: dict, fw: str, name: str, workers: int, config: dict) -> str:
    """The demo's training (``fw``) through tpuflow_driver.train as a Ray job, one CPU per worker; its logs."""
    spec = {
        "framework": fw,
        "train_loop": f"addition.train_{fw}:train_loop_per_worker",
        "run_name": f"bench-{name}-{time.time_ns() % 10**9}",
        "storage_path": str(ctx.work / "train"),
        "scaling_config": {"num_workers": workers, "resources_per_worker": {"CPU": 1}},
        "train_loop_config": config,
        "datasets": {"train": data["train"]},
        "worker_env": {"JAX_PLATFORMS": "cpu"},
    }
    _, logs = ctx.run_job(f"python -m tpuflow_driver.train --spec-json '{json.dumps(spec)}'", name=name)
    return logs


@measure("train_step_ratio")
def train_step_ratio(ctx: Context) -> list[Result]:
    data = ctx.data()
    workers, steps, log_every = 2, (150 if ctx.quick else 400), 25
    rows = []
    for fw in ("jax", "torch"):
        ray_logs = _train_job(ctx, data, fw, f"train-{fw}", workers, {"num_steps": steps, "log_every": log_every})
        log = ctx.work / f"plain-{fw}.log"
        env = {**os.environ, "PYTHONPATH": str(WORKLOADS), "JAX_PLATFORMS": "cpu"}
        with spawned([sys.executable, str(JOBS / "plain_train.py"), fw, str(workers), str(steps), str(log_every)],
                     env=env, log=log) as proc:  # fmt: skip
            code = proc.wait(timeout=900)
        plain_logs = log.read_text()
        if code != 0:
            raise RuntimeError(f"plain {fw} training failed ({code}):\n{plain_logs[-3000:]}")
        rs, rms = _step_times(ray_logs)
        ps, pms = _step_times(plain_logs)
        ray_ms, plain_ms = _steady(rms), _steady(pms)
        r = ratio(plain_ms, ray_ms)
        trainer = "JaxTrainer" if fw == "jax" else "TorchTrainer"
        dist = "jax.distributed" if fw == "jax" else "torch.distributed (gloo, DDP)"
        rows.append(Result(
            "train_step_ratio", ray_ms, "ms/step", plain_ms, r, "ratio >= 0.8", goal_check(r, ">=", 0.8), variant=fw,
            baseline_is=f"the same step in a plain {dist} loop, {workers} processes, same global batch, preloaded rows",
            ratio_means="plain ms/step ÷ Ray Train ms/step (higher is better)",
            notes=f"{trainer} via tpuflow_driver.train as a Ray job (Ray Data input), {steps} steps, median of the "
                  f"{log_every}-step windows after the first",
            details={"series_unit": "ms/step", "series_x": "step"},
            series={trainer: rms, f"{trainer}_x": [float(s) for s in rs], f"plain {fw}": pms,
                    f"plain {fw}_x": [float(s) for s in ps]},
        ))  # fmt: skip
    return rows


@measure("input_feed_overhead")
def input_feed_overhead(ctx: Context) -> list[Result]:
    from tpuflow.rayjob.hooks import parse_result

    data = ctx.data()
    steps = 150 if ctx.quick else 300
    _, logs = ctx.run_job(f"python {JOBS / 'feed.py'} {data['train']} {steps}", name="feed")
    res = parse_result(logs)
    ray_ms, pre_ms = median(res["ray_data_ms"][3:]), median(res["preloaded_ms"][3:])
    value = ray_ms / pre_ms - 1
    return [Result(
        "input_feed_overhead", value, "fraction", 0.0, ray_ms / pre_ms, "value <= 0.05", goal_check(value, "<=", 0.05),
        baseline_is=f"the same JAX step on preloaded arrays in the same process ({pre_ms:.2f} ms/step)",
        ratio_means="Ray Data ms/step ÷ preloaded ms/step",
        notes=f"one process, global batch 128, {steps} steps each, median; Ray Data {ray_ms:.2f} ms/step "
              f"(read_parquet of prep's train set, iter_jax_batches with the product's collate, prefetch 4); "
              f"date {DATE}",
        details={"ray_data_ms": ray_ms, "preloaded_ms": pre_ms, "series_unit": "ms/step", "series_x": "step"},
        series={"iter_jax_batches": res["ray_data_ms"], "preloaded": res["preloaded_ms"]},
    )]  # fmt: skip


@measure("preemption_check_overhead")
def preemption_check_overhead(ctx: Context) -> list[Result]:
    """What looking at Ray Train's preemption notice costs a step: the demo's JaxTrainer loop looking at the
    default cadence (and every step) vs never looking, same run."""
    _workloads_path()
    from addition.training import DEFAULTS

    default = int(DEFAULTS["preemption_check_every"])
    data = ctx.data()
    workers, steps, log_every = 2, (150 if ctx.quick else 400), 25
    ms: dict[int, float | None] = {}
    series: dict[str, list[float]] = {}
    for every in sorted({0, 1, default}):
        config = {"num_steps": steps, "log_every": log_every, "preemption_check_every": every}
        logs = _train_job(ctx, data, "jax", f"train-notice{every}", workers, config)
        _, step_ms = _step_times(logs)
        ms[every], series[f"every {every} steps" if every else "never"] = _steady(step_ms), step_ms
    value = ratio(ms[default], ms[0])
    every_step = ratio(ms[1], ms[0])
    overhead = None if value is None else value - 1
    return [Result(
        "preemption_check_overhead", overhead, "fraction", 0.0, value, "value <= 0.05",
        goal_check(overhead, "<=", 0.05),
        baseline_is=f"the same JaxTrainer loop never looking ({ms[0]} ms/step), {workers} workers, {steps} steps",
        ratio_means=f"ms/step looking every {default} steps (the default) ÷ ms/step never looking",
        notes=f"ray.train.get_preemption_info() (a barrier of the workers) every {default} steps; every step: "
              f"ratio {every_step}; median of the {log_every}-step windows after the first",
        details={"ms_per_step": {str(k): v for k, v in ms.items()}, "every_step_ratio": every_step,
                 "series_unit": "ms/step"},
        series=series,
    )]  # fmt: skip
