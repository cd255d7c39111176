"""The budget guard's arithmetic: the ``max_chip_hours`` Param and the estimate a run is checked against.

Pure module. The estimate is the run's slices' chips times the time the same DAG's previous run held
each slice (its ledger); without a previous ledger there is nothing to estimate from, and nothing is
guessed: the run goes ahead and the ledger watch during training still holds it to the budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tpuflow.errors import UserInputError

MAX_CHIP_HOURS_PARAM = "max_chip_hours"
# past a slice's bound: the teardowns' time, and a retry's
MAX_RUN_MARGIN_S = 900


def check_max_chip_hours(value: Any, field: str = f"params.{MAX_CHIP_HOURS_PARAM}") -> float | None:
    """None (no budget) or a number > 0."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UserInputError(field, value, "give a number of chip-hours > 0, or leave it empty for no budget")
    try:
        number = float(value)
    except ValueError:
        raise UserInputError(field, value, "give a number of chip-hours > 0, or leave it empty for no budget") from None
    if not number > 0 or number != number or number == float("inf"):
        raise UserInputError(field, value, "give a number of chip-hours > 0, or leave it empty for no budget")
    return number


def estimate_chip_hours(
    slices: Sequence[Mapping[str, Any]], previous: Mapping[str, Any] | None
) -> tuple[float | None, str]:
    """(estimate, basis): ``slices`` are ``{"role", "chips"}``; ``previous`` a previous run's ledger."""
    if not previous or not previous.get("slices"):
        return None, "no previous run's ledger to estimate from"
    seconds = {s["role"]: float(s.get("seconds") or 0.0) for s in previous["slices"]}
    missing = [s["role"] for s in slices if s["role"] not in seconds]
    if missing:
        return None, f"the previous run's ledger has no {', '.join(missing)} slice"
    total = sum(int(s["chips"]) * seconds[s["role"]] / 3600.0 for s in slices)
    basis = ", ".join(f"{s['role']}: {s['chips']} chips x {seconds[s['role']]:.0f} s" for s in slices)
    return round(total, 6), f"previous run's durations ({basis})"


def over_budget(ledger_chip_hours: float, max_chip_hours: float | None) -> bool:
    return max_chip_hours is not None and ledger_chip_hours > max_chip_hours


def max_run_seconds(max_chip_hours: float | None, chips: int, run_timeout_s: float | None = None) -> int | None:
    """How long one slice of ``chips`` may live in a run, for GKE's maxRunDuration: no longer than the whole
    budget spent on it alone, nor than the run may last (its dagrun_timeout), plus a margin; None: no bound."""
    bounds = [b for b in (max_chip_hours and max_chip_hours * 3600.0 / max(chips, 1), run_timeout_s) if b]
    return math.ceil(min(bounds)) + MAX_RUN_MARGIN_S if bounds else None
