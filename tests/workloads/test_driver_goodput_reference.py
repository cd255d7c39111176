"""One run's StepClock timeline fed to Google's ml-goodput-measurement, offline, through its own log-reading path.

The reference reads its entries from a logger (Cloud Logging in production); here `ListLogger` is that
logger, written by the reference's own GoodputRecorder and read by its GoodputCalculator. The run is the
demo's JAX training through the project's fit loop (CPU, small). How the two ledgers map:

- ``startup`` -> TRAINING_PREP (the recorder's training-preparation span);
- the first step's ``data_wait`` -> DATA_LOADING_SYNC; later ``data_wait`` spans -> a custom badput event
  DATA_WAIT (the reference's own async data loading is counted as productive, ours is not);
- ``checkpoint`` -> UNPRODUCTIVE_CHECKPOINT_SAVE_TIME (orbax's checkpoint-manager entries);
- ``compile`` (the whole first step) -> PROGRAM_STARTUP, which the reference counts as the first step's
  excess over the average step. The two productive times differ by what is explained: the average step the
  reference leaves in productive time, and the last step's data wait (the reference counts the time from
  the last step's start to the job's end as productive, whole).
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

goodput = pytest.importorskip("ml_goodput_measurement.src.goodput")
pytest.importorskip("optax")

JOB = "tpuflow-goodput-reference"


class ListLogger:
    """The reference's logger interface (write / read entries), kept in a list."""

    def __init__(self) -> None:
        self.job_name = JOB
        self.entries: list[dict[str, Any]] = []

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        if entry is not None:
            self.entries.append(entry)

    def flush(self) -> None:
        pass

    def read_cloud_logging_entries(self, start_time: Any = None, end_time: Any = None, last_entry_info: Any = None):
        return list(self.entries), (None, None)


def utc(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC)


def run_demo(timeline: list[tuple[str, float, float, int]]) -> dict[str, Any]:
    """The demo's jax training through `fit`, a StepClock keeping the timeline, a save every 10 steps."""
    from addition.data import generate
    from addition.model_jax import init_params
    from addition.train_jax import DataParallelState
    from addition.training import fit, model_config, resolve_config
    from tpuflow_driver.goodput import StepClock

    cfg = resolve_config({"num_steps": 40, "global_batch_size": 32, "checkpoint_every": 10, "log_every": 10})
    clock = StepClock(timeline=timeline)
    state = DataParallelState(cfg, init_params(model_config(cfg)[1], 0))
    rows = generate("2026-01-01", "train", 32 * 40, num_heldout=200)["tokens"].astype(np.int32)

    def batches(_epoch: int):
        for i in range(40):
            time.sleep(0.002)  # a data wait worth measuring
            yield state.global_batch(rows[i * 32 : (i + 1) * 32])

    def save(step: int, epoch: int, loss: float) -> None:
        time.sleep(0.05)  # a save of a size that matters next to these steps

    def step(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)  # steps long enough that one step's jitter under load stays well inside the 2 % compared
        return state.step(*args, **kwargs)

    fit(step, state.fetch_float, cfg, batches, clock=clock, on_checkpoint=save, log=lambda _m: None)
    return clock.record()


def feed_reference(timeline: list[tuple[str, float, float, int]], logger: ListLogger) -> None:
    """Write the timeline through the reference's GoodputRecorder (and orbax-style checkpoint entries)."""
    rec = goodput.GoodputRecorder(JOB, "tpuflow", logging_enabled=True, cloud_logger=logger)
    job_start, job_end = timeline[0][1], timeline[-1][2]
    rec.record_job_start_time(utc(job_start))
    first_wait = True
    for cause, start, end, step in timeline:
        if cause == "startup":
            rec.record_training_preparation_start_time(utc(start))
            rec.record_training_preparation_end_time(utc(end))
        elif cause == "data_wait" and first_wait:
            rec.record_data_loading_start_time(utc(start))
            rec.record_data_loading_end_time(utc(end))
            first_wait = False
        elif cause == "data_wait":
            rec.record_custom_badput_event_start_time(utc(start), "data_wait")
            rec.record_custom_badput_event_end_time(utc(end), "data_wait")
        elif cause in ("compile", "productive"):
            pass
        elif cause == "checkpoint":
            logger.write_cloud_logging_entry({
                "job_name": JOB, "event_type": "save", "step": step, "directory": "/tmp/ckpt",
                "checkpoint_manager_blocking_duration_secs": end - start, "checkpointer_blocking_duration_secs": end - start,
                "wait_for_prev_duration_secs": 0.0, "get_old_steps_duration_secs": 0.0,
                "checkpoint_manager_blocking_start_time": start,
            })  # fmt: skip
    # a step starts where the previous one's time ended: its data wait (then subtracted as a custom event)
    # for every step but the first, whose data wait is the sync data loading before it
    starts: dict[int, float] = {}
    prev_end = None
    for cause, start, end, step in timeline:
        if cause in ("compile", "productive"):
            starts[step] = prev_end if step > 1 and prev_end is not None else start
        if cause in ("compile", "productive", "checkpoint"):
            prev_end = end
    for step, start in sorted(starts.items()):
        rec.record_step_start_time(step, utc(start))
    rec.record_job_end_time(utc(job_end))
    logger.entries.sort(key=lambda e: min(v for k, v in e.items() if k.endswith("_time") and isinstance(v, float))
                        if any(k.endswith("_time") and isinstance(v, float) for k, v in e.items()) else 0.0)  # fmt: skip


def test_step_clock_agrees_with_ml_goodput_measurement(tmp_path: Path) -> None:
    timeline: list[tuple[str, float, float, int]] = []
    ours = run_demo(timeline)
    logger = ListLogger()
    feed_reference(timeline, logger)
    # cache_dir: the calculator keeps its state between runs there (default /tmp: an earlier run's figures)
    calc = goodput.GoodputCalculator(JOB, "tpuflow", cloud_logger=logger, using_pathways=False, cache_dir=str(tmp_path))
    calc.get_job_goodput(include_badput_breakdown=True)
    details = calc.get_job_goodput_details()
    ref_productive = details["goodput_time"][goodput.GoodputType.TOTAL]
    bad = details["badput_time"]
    s = ours["seconds"]
    productive_steps = [end - start for cause, start, end, _ in timeline if cause == "productive"]
    average_step = float(np.mean(productive_steps[:-1]))  # the reference's average: the steps between two starts

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 0.02 * max(abs(b), 1e-9) + 1e-4

    assert close(bad[goodput.BadputType.TRAINING_PREP], s["startup"])
    data_first = next(end - start for cause, start, end, _ in timeline if cause == "data_wait")
    assert close(bad[goodput.BadputType.DATA_LOADING_SYNC], data_first)
    custom = bad[goodput.BadputType.CUSTOM_BADPUT_EVENTS]
    # the last step's data wait lies after its start, in the tail (job end - last step start) that the
    # reference counts as productive whole: the other explained difference
    data_last = [end - start for cause, start, end, _ in timeline if cause == "data_wait"][-1]
    assert close(custom.get("DATA_WAIT", 0.0) + data_first + data_last, s["data_wait"])
    assert close(bad[goodput.BadputType.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME], s["checkpoint"])
    # the first step: ours all compile; the reference's its excess over the average step
    assert close(bad[goodput.BadputType.PROGRAM_STARTUP], s["compile"] - average_step)
    # and the moments between two of our segments after the first step began (a loss fetched for the log, the
    # loop's own bookkeeping): no cause of ours, the reference's productive time (between two step starts)
    spans = sorted((start, end) for cause, start, end, _ in timeline if cause != "startup")
    first = next(start for cause, start, _, _ in timeline if cause == "compile")
    holes = sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:], strict=False) if b[0] > first)
    assert close(ref_productive, s["productive"] + average_step + data_last + holes)
    assert bad[goodput.BadputType.WASTED_PROGRESS_FROM_DISRUPTION] == pytest.approx(0.0, abs=1e-6)
