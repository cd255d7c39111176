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


def _number(value: Any) -> float | None:
    """A finite number from a ledger (an earlier run's XCom), or None: what is not one is no basis."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _step_seconds(previous: Mapping[str, Any], entry: Mapping[str, Any]) -> tuple[float, float] | None:
    """(seconds of the previous run's slice that were not productive steps, seconds per productive step), from
    its measured goodput; None where it has none (no timeline, or no productive step counted: a rerun that
    reused its finished checkpoint trained none)."""
    timeline = entry.get("timeline")
    seconds = timeline.get("seconds") if isinstance(timeline, Mapping) else None
    productive = _number(seconds.get("productive")) if isinstance(seconds, Mapping) else None
    goodput = previous.get("goodput")
    counts = goodput.get("steps") if isinstance(goodput, Mapping) else None
    steps = _number(counts.get("productive")) if isinstance(counts, Mapping) else None
    if not productive or not steps or productive <= 0 or steps <= 0:
        return None
    return max(0.0, (_number(entry.get("seconds")) or 0.0) - productive), productive / steps


def _billed_at(ledger: Any) -> float | None:
    """When a previous ledger's first slice was created, if it billed a slice (None: not a basis)."""
    if not isinstance(ledger, Mapping) or not isinstance(ledger.get("slices"), list):
        return None
    slices = [s for s in ledger["slices"] if isinstance(s, Mapping)]
    if not any((_number(s.get("seconds")) or 0.0) > 0 for s in slices):
        return None
    return max((_number(s.get("created_at")) or 0.0 for s in slices), default=0.0)


def billed_ledgers(pulled: Any) -> list[Mapping[str, Any]]:
    """The DAG's previous ledgers that billed a slice, newest first, from what an XCom pull with
    ``include_prior_dates`` gives: one ledger, or (Airflow 3 with several prior runs) a list in no date order.
    A run that provisioned nothing (rejected, failed before its slice) is no basis for an estimate."""
    ledgers = pulled if isinstance(pulled, list | tuple) else [pulled]
    billed = [(at, ledger) for ledger in ledgers if (at := _billed_at(ledger)) is not None]
    return [ledger for _, ledger in sorted(billed, key=lambda pair: pair[0], reverse=True)]


def latest_billed_ledger(pulled: Any) -> Mapping[str, Any] | None:
    """The newest of the DAG's previous ledgers that billed a slice (billed_ledgers)."""
    billed = billed_ledgers(pulled)
    return billed[0] if billed else None


def _entries(ledger: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {s["role"]: s for s in ledger.get("slices") or [] if isinstance(s, Mapping) and "role" in s}


def basis_ledger(slices: Sequence[Mapping[str, Any]], pulled: Any) -> Mapping[str, Any] | None:
    """The previous ledger this run is estimated from: the newest that billed a slice; when this run asks a
    number of training steps, the newest whose training steps were measured (a rerun that reused its finished
    checkpoint trained no step: its short slice says nothing of what 100,000 steps take), else the newest."""
    billed = billed_ledgers(pulled)
    stepped = [s["role"] for s in slices if s.get("steps") not in (None, "")]
    for ledger in billed if stepped else []:
        entries = _entries(ledger)
        if all(r in entries and _step_seconds(ledger, entries[r]) is not None for r in stepped):
            return ledger
    return billed[0] if billed else None


def estimate_chip_hours(
    slices: Sequence[Mapping[str, Any]], previous: Mapping[str, Any] | None
) -> tuple[float | None, str]:
    """(estimate, basis): ``slices`` are ``{"role", "chips"}`` (and ``steps``: the training steps this run takes
    on that slice); ``previous`` a previous run's ledger (basis_ledger).

    A slice is expected to last as long as the previous run's did; a training slice whose previous timeline
    measured its productive steps lasts that run's measured badput (everything but productive steps) plus
    this run's steps at the measured time per step."""
    if not previous or not previous.get("slices"):
        return None, "no previous run's ledger to estimate from"
    entries = _entries(previous)
    missing = [s["role"] for s in slices if s["role"] not in entries]
    if missing:
        return None, f"the previous run's ledger has no {', '.join(missing)} slice"
    total, basis = 0.0, []
    for s in slices:
        entry, chips = entries[s["role"]], int(s["chips"])
        measured = _step_seconds(previous, entry) if s.get("steps") not in (None, "") else None
        if measured is None:
            seconds = _number(entry.get("seconds")) or 0.0
            basis.append(f"{s['role']}: {chips} chips x {seconds:.0f} s")
        else:
            badput, per_step = measured
            seconds = badput + per_step * int(s["steps"])
            basis.append(
                f"{s['role']}: {chips} chips x ({badput:.0f} s not training as measured + {int(s['steps'])} steps x "
                f"{per_step:.3f} s)"
            )
        total += chips * seconds / 3600.0
    return round(total, 6), f"previous run's measured times ({', '.join(basis)})"


def over_budget(ledger_chip_hours: float, max_chip_hours: float | None) -> bool:
    return max_chip_hours is not None and ledger_chip_hours > max_chip_hours


def max_run_seconds(max_chip_hours: float | None, chips: int, run_timeout_s: float | None = None) -> int | None:
    """How long one slice of ``chips`` may live in a run, for GKE's maxRunDuration: no longer than the whole
    budget spent on it alone, nor than the run may last (its dagrun_timeout), plus a margin; None: no bound."""
    bounds = [b for b in (max_chip_hours and max_chip_hours * 3600.0 / max(chips, 1), run_timeout_s) if b]
    return math.ceil(min(bounds)) + MAX_RUN_MARGIN_S if bounds else None
