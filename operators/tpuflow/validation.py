"""Checks of plain values every door shares: durations, counts, numbers, names of things.

Each check raises ``UserInputError(field, value, fix)`` (one line: the field, the bad value, what is
valid) and returns the value in its normal form. Operators call them from their one validation
function; CLI flags call the same ones, so a value means the same thing whichever door it came in by.
Pure module: no Airflow, no clients.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from tpuflow.errors import UserInputError

# Nothing here waits longer than a year; a bigger number is a unit mistake (ms for s, say).
MAX_SECONDS = 366 * 24 * 3600.0


def _range_text(minimum: float | None, maximum: float | None, *, above: bool) -> str:
    low = "" if minimum is None else (f"> {minimum:g}" if above else f">= {minimum:g}")
    high = "" if maximum is None else f"<= {maximum:g}"
    return " and ".join(p for p in (low, high) if p)


def check_number(
    field: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: bool = False,
    what: str = "a number",
) -> float:
    """A finite real number (not a bool, not text) within [minimum, maximum]; ``above``: > minimum."""
    bounds = _range_text(minimum, maximum, above=above)
    fix = f"give {what}" + (f" {bounds}" if bounds else "")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserInputError(field, value, fix)
    number = float(value)
    if not math.isfinite(number):
        raise UserInputError(field, value, fix + " (a finite number)")
    if minimum is not None and (number <= minimum if above else number < minimum):
        raise UserInputError(field, value, fix)
    if maximum is not None and number > maximum:
        raise UserInputError(field, value, fix)
    return number


def check_seconds(
    field: str,
    value: Any,
    *,
    allow_zero: bool = False,
    optional: bool = False,
    maximum: float = MAX_SECONDS,
) -> float | None:
    """A duration in seconds (a number or a timedelta): finite, > 0 (``allow_zero``: >= 0), at most
    ``maximum``; ``optional``: None means "no limit" and is returned as None."""
    if value is None and optional:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    fix = f"give a number of seconds {'>= 0' if allow_zero else '> 0'} and <= {maximum:g}" + (
        ", or None for no limit" if optional else ""
    )
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or (seconds < 0 if allow_zero else seconds <= 0)
        or seconds > maximum
    ):
        raise UserInputError(field, value, fix)
    return float(seconds)


def check_rendered_seconds(field: str, value: Any) -> float | None:
    """check_seconds(optional=True) of a value that may be a template rendered without native types: "None"
    or "" is None, a number's text that number."""
    if isinstance(value, str):
        text = value.strip()
        if text in ("", "None"):
            return None
        try:
            value = float(text)
        except ValueError:
            pass  # named as given
    return check_seconds(field, value, optional=True)


def check_whole_seconds(field: str, value: Any, *, maximum: int | None = None, fix: str | None = None) -> int | None:
    """Whole seconds > 0 (at most ``maximum``) as an int, a whole float or digits; None or empty: None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    seconds: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, float) and value.is_integer():
        seconds = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        seconds = int(value.strip())
    if seconds is None or seconds <= 0 or (maximum is not None and seconds > maximum):
        bound = f"from 1 to {maximum}" if maximum is not None else "> 0"
        raise UserInputError(field, value, fix or f"give whole seconds {bound}, or leave it empty")
    return seconds


def check_count(
    field: str, value: Any, *, minimum: int = 1, maximum: int | None = None, what: str = "a whole number"
) -> int:
    """A whole number (an int, or a float with no fraction; not a bool, not text) in [minimum, maximum]."""
    bounds = _range_text(minimum, maximum, above=False)
    fix = f"give {what} {bounds}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserInputError(field, value, fix)
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise UserInputError(field, value, fix)
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        raise UserInputError(field, value, fix)
    return number


def check_port(field: str, value: Any) -> int:
    """A TCP port a server can listen on (1-65535)."""
    return check_count(field, value, minimum=1, maximum=65535, what="a TCP port")


def check_date(field: str, value: Any) -> str:
    """A calendar date written YYYY-MM-DD (a run's logical date, an output folder's name).

    Strict: Python 3.11's date.fromisoformat also takes 20261203 and 2026-W49-4, which name the same day
    by another spelling; the run's folders are keyed by the YYYY-MM-DD spelling, so any other one would
    look for outputs under a folder no task wrote."""
    fix = "give the date as YYYY-MM-DD, e.g. 2026-01-31"
    if not isinstance(value, str) or not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
        raise UserInputError(field, value, fix)
    try:
        date.fromisoformat(value)
    except ValueError:
        raise UserInputError(field, value, fix + " (a day that exists)") from None
    return value


def check_folder(field: str, path: str | Path | None) -> Path | None:
    """A folder to keep state in: it may be missing (it is created) but must not be a file."""
    if path is None:
        return None
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UserInputError(field, str(path), "give a folder (it is created if missing), not a file")
    return folder


def check_text(field: str, value: Any, *, optional: bool = False, fix: str = "give a non-empty string") -> str | None:
    """A non-empty string (``optional``: or None)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserInputError(field, value, fix + (" (or leave it unset)" if optional else ""))
    return value


def check_mapping(field: str, value: Any, *, optional: bool = True) -> Mapping[str, Any] | None:
    if value is None and optional:
        return None
    if not isinstance(value, Mapping):
        raise UserInputError(field, value, "give a dict" + (" (or leave it unset)" if optional else ""))
    return value


def check_train_loop_config(field: str, config: Mapping[str, Any] | None) -> None:
    """Any number in a train_loop_config finite. The options themselves are the train loop's own: its
    workload checks them (tpuflow.pipeline.workload.Workload.check_params)."""
    for key, value in (config or {}).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UserInputError(f"{field}[{key}]", value, "give a finite number")
