"""Every billed chip-second of a slice by cause (tpuflow.cost.goodput)."""

from __future__ import annotations

import pytest

from tpuflow.cost.goodput import ledger_lines, run_goodput, segments, slice_timeline, split_training, summary_line


def test_overlapping_work_goes_to_what_uses_the_chips_and_gaps_are_idle() -> None:
    cut = segments(0.0, 100.0, [(10.0, 40.0, "data_prep"), (20.0, 30.0, "preflight"), (50.0, 90.0, "training")])
    assert cut == [
        (0.0, 10.0, "idle"),
        (10.0, 20.0, "data_prep"),
        (20.0, 30.0, "preflight"),
        (30.0, 40.0, "data_prep"),
        (40.0, 50.0, "idle"),
        (50.0, 90.0, "training"),
        (90.0, 100.0, "idle"),
    ]
    # work outside the span is cut off; neighbours of one cause merge
    assert segments(0.0, 10.0, [(-5.0, 3.0, "job"), (3.0, 20.0, "job")]) == [(0.0, 10.0, "job")]


def test_a_training_job_is_split_as_its_loop_measured() -> None:
    split = split_training(100.0, {"compile": 10.0, "productive": 70.0, "startup": 5.0})
    assert split == {"compile": 10.0, "productive": 70.0, "startup": 20.0}  # the job's 15 s the loop never saw
    assert split_training(50.0, None) == {"training": 50.0}
    # the hosts' clocks ran a little ahead of Ray's job times: scaled into the job's span
    assert sum(split_training(50.0, {"productive": 60.0, "checkpoint": 10.0}).values()) == pytest.approx(50.0)


def _gke_slice() -> dict:
    works = [
        {"cause": "preflight", "started_at": 400.0, "ended_at": 420.0},
        {"cause": "training", "started_at": 430.0, "ended_at": 1430.0,
         "breakdown": {"startup": 20.0, "compile": 30.0, "productive": 900.0, "checkpoint": 20.0}},
    ]  # fmt: skip
    return slice_timeline(100.0, 1500.0, works, now=9999.0, provisioned_at=300.0)


def test_a_gke_slice_from_pool_create_to_delete() -> None:
    timeline = _gke_slice()
    seconds = timeline["seconds"]
    assert seconds["provisioning"] == 200.0  # create operation start -> end
    assert seconds["cluster_start"] == 100.0  # nodes ready -> the first work on the slice
    assert seconds["preflight"] == 20.0
    assert seconds["idle"] == 10.0 + 70.0  # between preflight and training; training's end to the pool's delete
    assert seconds["startup"] == 20.0 + 30.0 and seconds["productive"] == 900.0
    assert sum(seconds.values()) == pytest.approx(1400.0)  # every billed second, once
    assert timeline["segments"][0] == [100.0, 300.0, "provisioning"]


def test_the_run_goodput_over_slices_and_the_demo_line() -> None:
    train = {"chips": 16, "timeline": _gke_slice()}
    serve = {"chips": 4, "timeline": slice_timeline(1000.0, None, [{"cause": "serving", "started_at": 1100.0,
                                                                      "ended_at": None}], now=1600.0)}  # fmt: skip
    result = run_goodput([train, serve])
    billed = 16 * 1400.0 + 4 * 600.0
    assert result["billed_chip_seconds"] == pytest.approx(billed)
    assert result["goodput"] == pytest.approx(16 * 900.0 / billed, abs=1e-4)
    top = [b["cause"] for b in result["badput"]]
    assert top[:2] == ["provisioning", "cluster_start"] and "serving" not in top and "productive" not in top
    line = summary_line(result)
    assert line.startswith("goodput 58 %; top badput: provisioning 13 %, cluster start 8 %")
    lines = ledger_lines({"chip_hours": 6.89, "slices": [1, 2], "goodput": result})
    assert lines[0].endswith("6.8900 over 2 slice(s)") and lines[1].startswith("goodput 58 %; top badput: ")


def test_training_a_loop_did_not_split_leaves_goodput_unmeasured() -> None:
    timeline = slice_timeline(0.0, 100.0, [{"cause": "training", "started_at": 10.0, "ended_at": 90.0}], now=100.0)
    result = run_goodput([{"chips": 4, "timeline": timeline}])
    assert result["goodput"] is None and "not measured" in summary_line(result)
    assert slice_timeline(None, None, [], now=1.0) == {"seconds": {}, "segments": []}
