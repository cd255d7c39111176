"""The driver's join of the train loop's attempts into the fit's timeline (tpuflow_driver.goodput)."""

from __future__ import annotations

import pytest
from tpuflow_driver.goodput import Recorder, StepClock, training_timeline


def _attempt(began: float, last: float, start: int, step: int, **seconds: float) -> dict:
    return {"began_at": began, "last_at": last, "start_step": start, "step": step, "seconds": seconds, "steps": {}}


def test_the_gap_between_attempts_is_the_preemption_or_the_failure() -> None:
    first = _attempt(110.0, 200.0, 0, 300, startup=5.0, productive=80.0, checkpoint=5.0)
    second = _attempt(230.0, 300.0, 250, 500, restore=4.0, redone=10.0, productive=56.0)
    timeline = training_timeline([second, first], 100.0, 305.0, hosts_lost=True)
    seconds = timeline["seconds"]
    assert seconds["preemption"] == pytest.approx(30.0)  # the first attempt's last record to the second's start
    assert seconds["startup"] == pytest.approx(5.0 + 10.0 + 5.0)  # before the first attempt, in it, after the last
    assert seconds["productive"] == pytest.approx(136.0) and seconds["redone"] == pytest.approx(10.0)
    assert timeline["attempts"] == 2 and sum(seconds.values()) == pytest.approx(205.0)
    assert timeline["recorded"] == [{"from": 0, "to": 300}, {"from": 250, "to": 500}]
    assert "failure" in training_timeline([first, second], 100.0, 305.0, hosts_lost=False)["seconds"]


def test_a_loop_without_a_clock_is_all_startup_and_the_recorder_tells_how_far_attempts_got() -> None:
    assert training_timeline([], 10.0, 40.0, hosts_lost=False)["seconds"] == {"startup": 30.0}
    recorder = Recorder()
    assert recorder.begin() == 0
    clock = StepClock(send=recorder.update, flush_s=0.0)
    clock.begin(0)
    for step in (1, 2, 3):
        clock.step(step)
    assert recorder.begin() == 3 and recorder.records()[0]["steps"] == {"compile": 1, "productive": 2}


def test_a_recorder_gone_never_stops_training() -> None:
    def broken(key: str, record: dict) -> None:
        raise RuntimeError("actor died")

    clock = StepClock(send=broken, flush_s=0.0)
    clock.begin(0)
    clock.step(1)
    clock.step(2)  # the first failed send turned sending off
    assert clock.steps == {"compile": 1, "productive": 1}


def test_the_checkpoint_trade_off_is_what_a_save_costs_against_the_work_at_risk() -> None:
    attempt = _attempt(0.0, 100.0, 0, 200, productive=40.0, checkpoint=6.0)
    attempt.update(steps={"productive": 200}, saves=3)
    measured = training_timeline([attempt], 0.0, 100.0, hosts_lost=False, checkpoint_every=50)["checkpoint"]
    assert measured == {"saves": 3, "mean_save_s": 2.0, "mean_step_s": 0.2, "every": 50, "at_risk_s": 10.0}
