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


def test_train_loop_config_conventional_options() -> None:
    check_train_loop_config("cfg", {"num_steps": 10, "learning_rate": 1e-3, "warmup_steps": 0, "my_option": "x"})
    check_train_loop_config("cfg", {"num_steps": "1500", "learning_rate": "6e-3"})  # rendered as text
    with pytest.raises(UserInputError, match=r"cfg\[num_steps\]='0' is invalid"):
        check_train_loop_config("cfg", {"num_steps": "0"})
    with pytest.raises(UserInputError, match=r"cfg\[my_scale\]=nan"):
        check_train_loop_config("cfg", {"my_scale": math.nan})


def test_user_input_error_is_one_short_line() -> None:
    err = UserInputError("manifest", {"spec": "x" * 5000}, "not valid YAML:\n  line 3\n  column 2")
    text = str(err)
    assert "\n" not in text
    assert len(text) < 300
    assert text.endswith("is invalid: not valid YAML: line 3 column 2")
    assert err.value == {"spec": "x" * 5000}  # the field keeps the whole value
