"""tpuflow.validation: the shared checks of durations, counts, numbers, ports and folders, and the one-line
UserInputError every door prints."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.validation import (
    check_count,
    check_date,
    check_folder,
    check_number,
    check_port,
    check_seconds,
    check_train_loop_config,
)

BAD_SECONDS: list[tuple[Any, dict[str, Any]]] = [
    (-1, {}),
    (0, {}),
    (math.nan, {}),
    (math.inf, {}),
    (-math.inf, {"allow_zero": True}),
    (True, {}),
    ("10", {}),
    (None, {}),
    (timedelta(seconds=-5), {}),
    (10**9, {}),  # beyond a year: a unit mistake
    (-0.5, {"allow_zero": True}),
]


@pytest.mark.parametrize(("value", "kw"), BAD_SECONDS, ids=[repr(v) for v, _ in BAD_SECONDS])
def test_bad_seconds(value: Any, kw: dict[str, Any]) -> None:
    with pytest.raises(UserInputError) as err:
        check_seconds("wait_timeout", value, **kw)
    assert err.value.field == "wait_timeout"
    assert str(err.value).startswith(f"wait_timeout={value!r} is invalid: give a number of seconds")


def test_good_seconds() -> None:
    assert check_seconds("t", 2) == 2.0
    assert check_seconds("t", timedelta(minutes=1)) == 60.0
    assert check_seconds("t", 0, allow_zero=True) == 0.0
    assert check_seconds("t", None, optional=True) is None


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "4", math.nan, None])
def test_bad_counts(value: Any) -> None:
    with pytest.raises(UserInputError, match=r"give a whole number >= 1"):
        check_count("num_slices", value)


def test_counts_and_numbers() -> None:
    assert check_count("n", 3.0) == 3
    assert check_count("n", 0, minimum=0) == 0
    assert check_number("lr", 1e-3, minimum=0, above=True) == 1e-3
    with pytest.raises(UserInputError, match=r"> 0"):
        check_number("lr", 0, minimum=0, above=True)
    with pytest.raises(UserInputError, match=r"finite"):
        check_number("lr", math.inf)


@pytest.mark.parametrize("value", [0, 65536, -1, "8080", 80.5])
def test_bad_ports(value: Any) -> None:
    with pytest.raises(UserInputError, match=r"a TCP port >= 1 and <= 65535"):
        check_port("--port", value)


def test_folder_may_be_missing_but_not_a_file(tmp_path: Path) -> None:
    assert check_folder("--work-dir", tmp_path / "new") == tmp_path / "new"
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserInputError, match=r"not a file"):
        check_folder("--work-dir", tmp_path / "f")


def test_train_loop_config_numbers_are_finite_and_its_options_the_workloads_own() -> None:
    check_train_loop_config("cfg", {"num_steps": 10, "learning_rate": 1e-3, "warmup_steps": 0, "my_option": "x"})
    # what an option accepts is the train loop's business (its workload's check_params), not tpuflow's
    check_train_loop_config("cfg", {"num_steps": "0", "learning_rate": -1})
    with pytest.raises(UserInputError, match=r"cfg\[my_scale\]=nan"):
        check_train_loop_config("cfg", {"my_scale": math.nan})


def test_user_input_error_is_one_short_line() -> None:
    err = UserInputError("manifest", {"spec": "x" * 5000}, "not valid YAML:\n  line 3\n  column 2")
    text = str(err)
    assert "\n" not in text
    assert len(text) < 300
    assert text.endswith("is invalid: not valid YAML: line 3 column 2")
    assert err.value == {"spec": "x" * 5000}  # the field keeps the whole value


@pytest.mark.parametrize(
    "value", ["20261203", "2026-W49-4", "2026-12-3", "2026-13-01", "2026-02-30", "2026-12-03T00:00", " 2026-12-03",
              "2026-12-03\n", "٢٠٢٦-١٢-٠٣", 20261203, None]
)  # fmt: skip
def test_dates_are_strictly_yyyy_mm_dd(value: Any) -> None:
    """Python 3.11 reads 20261203 and 2026-W49-4 as 2026-12-03; the run's folders are named 2026-12-03, so
    `tpuflow demo --date 20261203` ran and was then reported FAILED (its report was looked for elsewhere)."""
    with pytest.raises(UserInputError) as err:
        check_date("--date", value)
    assert str(err.value) == f"--date={value!r} is invalid: " + err.value.fix
    assert "YYYY-MM-DD" in err.value.fix
    assert check_date("--date", "2026-12-03") == "2026-12-03"


@pytest.mark.parametrize(
    ("topology", "num_slices", "fix"),
    [
        ("4x4", "99999999999999999999", "at most 15,000"),
        ("4x4", 10**30, "at most 15,000"),
        ("4x4", "9" * 100_000, "at most 15,000"),  # never converted: int() of it would raise ValueError
        ("4x4", 3751, "at most 3,750 slices of 4 host(s)"),
        ("1x1", 15_001, "at most 15,000"),
    ],
    ids=["20 digits", "10**30", "100k digits", "hosts over 15,000", "single-host over 15,000"],
)
def test_slice_counts_have_gke_maxima(topology: str, num_slices: Any, fix: str) -> None:
    import time

    from tpuflow.tpu import TpuSlice

    started = time.perf_counter()
    with pytest.raises(UserInputError) as err:
        TpuSlice.from_spec("v6e", topology, None, num_slices)
    assert err.value.field == "num_slices" and fix in err.value.fix
    assert "\n" not in str(err.value) and len(str(err.value)) < 400  # the value is shortened
    assert time.perf_counter() - started < 1.0
    assert TpuSlice.from_spec("v6e", "4x4", None, 3750).total_hosts == 15_000


def test_single_host_slices_fit_one_gke_node_pool() -> None:
    from tpuflow.tpu import TpuSlice

    assert TpuSlice.from_spec("v6e", "1x1", None, 1000).require(gke=True).total_hosts == 1000
    with pytest.raises(UserInputError, match=r"num_slices=1001 is invalid: .*1,000 nodes per node pool"):
        TpuSlice.from_spec("v6e", "1x1", None, 1001).require(gke=True)
    # Ray alone has no node-pool limit: the same count is fine for a local (simulated) slice description
    assert TpuSlice.from_spec("v6e", "1x1", None, 1001).require(ray=True).num_slices == 1001


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("", None), ("None", None), ("86400", 86400.0), (" 1.5 ", 1.5), (60, 60.0)]
)
def test_a_duration_rendered_without_native_types_reads_as_its_value(value: object, expected: float | None) -> None:
    from tpuflow.validation import check_rendered_seconds

    assert check_rendered_seconds("expires_after", value) == expected


@pytest.mark.parametrize("value", ["a day", "-5", "0", "inf"])
def test_a_bad_rendered_duration_names_the_field(value: str) -> None:
    from tpuflow.validation import check_rendered_seconds

    with pytest.raises(UserInputError) as err:
        check_rendered_seconds("expires_after", value)
    assert err.value.field == "expires_after" and "give a number of seconds > 0" in str(err.value)
