"""The admin's limits on what a run may spend, from Airflow Variables; a run's Params can only lower them.

Who may trigger a run is not who may decide what it spends: the Params ``max_chip_hours``, ``over_budget`` and
``idle_timeout`` are the triggering user's, so each is held to a ceiling an admin sets as a Variable (an
environment ``AIRFLOW_VAR_<NAME>`` too), with a safe default when it is unset:

    tpuflow_max_chip_hours             100   the most chip-hours a run may budget; an empty max_chip_hours is this
    tpuflow_over_budget                ask   the loosest over_budget a run may take: fail < ask < run
    tpuflow_max_idle_timeout            60   minutes: the longest a kept endpoint may sit idle; empty / 0 is this
    tpuflow_max_kept_endpoint_hours     24   the longest a kept endpoint's serve slice lives (GKE's maxRunDuration)

A Param above its ceiling (or empty, which used to mean "none") is held at the ceiling, and the task says so in
one log line; a non-finite number is a one-line error naming the Param. A Variable that is not a finite number
> 0 (or an over_budget choice) is a one-line error naming the Variable: a bad limit never means "no limit".
Cheap to import (the DAG files import it): ``airflow.sdk.Variable`` loads when a limit is read.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Generic, NamedTuple, TypeVar

from tpuflow.errors import UserInputError

_V = TypeVar("_V")

MAX_CHIP_HOURS_VARIABLE = "tpuflow_max_chip_hours"
OVER_BUDGET_VARIABLE = "tpuflow_over_budget"
MAX_IDLE_TIMEOUT_VARIABLE = "tpuflow_max_idle_timeout"
MAX_KEPT_ENDPOINT_VARIABLE = "tpuflow_max_kept_endpoint_hours"

DEFAULT_MAX_CHIP_HOURS = 100.0
DEFAULT_OVER_BUDGET = "ask"
DEFAULT_MAX_IDLE_TIMEOUT_MIN = 60.0
DEFAULT_MAX_KEPT_ENDPOINT_HOURS = 24.0

# over_budget's choices, strictest first: a run may take one at most as loose as the admin's
OVER_BUDGET_CHOICES = ("fail", "ask", "run")
# added to a kept endpoint's lifetime in its pool's maxRunDuration: the teardowns' time (tpuflow.cost.budget's margin)
KEPT_MARGIN_S = 900

log = logging.getLogger(__name__)


def variable(name: str, default: Any) -> Any:
    """The Variable ``name`` (its environment form first), or ``default`` when it is unset or empty."""
    from airflow.sdk import Variable

    value = Variable.get(name, default=None)
    return default if value is None or (isinstance(value, str) and not value.strip()) else value


def check_limit(name: str, value: Any, unit: str) -> float:
    """An admin's ceiling: a finite number > 0 (a Variable's text parsed)."""
    fix = f"an admin sets it to a finite number of {unit} > 0 (unset: the default)"
    if isinstance(value, bool):
        raise UserInputError(f"Variable {name}", value, fix)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserInputError(f"Variable {name}", value, fix) from None
    if not (math.isfinite(number) and number > 0):
        raise UserInputError(f"Variable {name}", value, fix)
    return number


class AdminLimits(NamedTuple):
    """The admin's ceilings (see the module docstring)."""

    max_chip_hours: float = DEFAULT_MAX_CHIP_HOURS
    over_budget: str = DEFAULT_OVER_BUDGET
    max_idle_timeout_min: float = DEFAULT_MAX_IDLE_TIMEOUT_MIN
    max_kept_endpoint_hours: float = DEFAULT_MAX_KEPT_ENDPOINT_HOURS


def admin_limits() -> AdminLimits:
    """The admin's ceilings from their Variables (defaults where unset), each checked."""
    over_budget = str(variable(OVER_BUDGET_VARIABLE, DEFAULT_OVER_BUDGET)).strip().lower()
    if over_budget not in OVER_BUDGET_CHOICES:
        raise UserInputError(
            f"Variable {OVER_BUDGET_VARIABLE}",
            over_budget,
            "an admin sets it to fail, ask or run: the loosest over_budget a run may take",
        )
    return AdminLimits(
        max_chip_hours=check_limit(
            MAX_CHIP_HOURS_VARIABLE, variable(MAX_CHIP_HOURS_VARIABLE, DEFAULT_MAX_CHIP_HOURS), "chip-hours"
        ),
        over_budget=over_budget,
        max_idle_timeout_min=check_limit(
            MAX_IDLE_TIMEOUT_VARIABLE, variable(MAX_IDLE_TIMEOUT_VARIABLE, DEFAULT_MAX_IDLE_TIMEOUT_MIN), "minutes"
        ),
        max_kept_endpoint_hours=check_limit(
            MAX_KEPT_ENDPOINT_VARIABLE, variable(MAX_KEPT_ENDPOINT_VARIABLE, DEFAULT_MAX_KEPT_ENDPOINT_HOURS), "hours"
        ),
    )


class Held(NamedTuple, Generic[_V]):
    """A Param's value as the run is held to it, and the one line saying why it differs from the ask ("" if not)."""

    value: _V
    note: str


def _hold(asked: float | None, ceiling: float, field: str, unit: str, held: str, empty: str) -> Held[float]:
    """A Param (checked; None: none asked) held at the admin's ceiling, with the line saying why when it is."""
    if asked is None:
        return Held(ceiling, f"{field} {empty} {held}")
    if asked > ceiling:
        return Held(ceiling, f"{field}={asked:g}{unit} is above the admin's ceiling: {held}")
    return Held(asked, "")


def hold_budget(asked: float | None, ceiling: float, field: str = "max_chip_hours") -> Held[float]:
    """``asked`` (a checked budget, None: none asked) held at the admin's ceiling."""
    held = f"the run is held to {ceiling:g} chip-hours (Variable {MAX_CHIP_HOURS_VARIABLE})"
    return _hold(asked, ceiling, field, "", held, "empty: the admin's ceiling;")


def check_over_budget(value: Any, field: str = "over_budget") -> str | None:
    """One of OVER_BUDGET_CHOICES, or None (empty: the admin's)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or value.strip().lower() not in OVER_BUDGET_CHOICES:
        raise UserInputError(
            field,
            value,
            'give "fail" (refuse the run), "ask" (wait for an approver) or "run" (where an admin allows it)',
        )
    return value.strip().lower()


def hold_over_budget(asked: str | None, allowed: str, field: str = "over_budget") -> Held[str]:
    """``asked`` (a checked choice, None: none) held at the loosest the admin allows."""
    if asked is None:
        return Held(allowed, f"{field} empty: the admin's {allowed!r} (Variable {OVER_BUDGET_VARIABLE})")
    if OVER_BUDGET_CHOICES.index(asked) > OVER_BUDGET_CHOICES.index(allowed):
        note = f"{field}={asked!r} is looser than the admin allows: the run takes {allowed!r}"
        return Held(allowed, f"{note} (Variable {OVER_BUDGET_VARIABLE})")
    return Held(asked, "")


def check_idle_timeout(value: Any, field: str = "params.idle_timeout") -> float | None:
    """Minutes >= 0, finite; None for empty (0 included: both used to mean "never")."""
    if value is None or value == "" or value == "None":
        return None
    fix = "give the minutes without a request after which a kept endpoint stops, a finite number >= 0"
    if isinstance(value, bool):
        raise UserInputError(field, value, fix)
    try:
        minutes = float(value)
    except (TypeError, ValueError):
        raise UserInputError(field, value, fix) from None
    if not math.isfinite(minutes) or minutes < 0:
        raise UserInputError(field, value, fix)
    return minutes or None


def hold_idle_timeout(asked: float | None, ceiling: float, field: str = "idle_timeout") -> Held[float]:
    """``asked`` (checked minutes, None: none) held at the admin's ceiling: a kept endpoint always stops when idle."""
    held = f"the endpoint stops after {ceiling:g} min without a request (Variable {MAX_IDLE_TIMEOUT_VARIABLE})"
    return _hold(asked, ceiling, field, " min", held, "empty or 0, which no longer means never:")


class RunLimits:
    """The pipeline DAGs' ``tpuflow_limits`` template macro: a Param as the admin's limits hold it, where the task
    that reads it is not tpuflow's budget code (the idle watch, the kept serve pool's GKE deadline)."""

    def idle_timeout(self, asked: Any) -> float:
        """The kept endpoint's idle minutes: the Param held at ``tpuflow_max_idle_timeout`` (logged when held)."""
        held = hold_idle_timeout(check_idle_timeout(asked), admin_limits().max_idle_timeout_min)
        if held.note:
            log.warning("%s", held.note)
        return held.value

    def kept_endpoint_seconds(self, bound: Any = None) -> int:
        """A kept endpoint's serve pool maxRunDuration: ``tpuflow_max_kept_endpoint_hours`` (plus the teardowns'
        margin), or ``bound`` (the budget guard's for the serve slice) when that is shorter."""
        cap = math.ceil(admin_limits().max_kept_endpoint_hours * 3600) + KEPT_MARGIN_S
        if isinstance(bound, int | float) and not isinstance(bound, bool) and math.isfinite(bound) and bound > 0:
            return min(cap, math.ceil(bound))
        return cap


RUN_LIMITS = RunLimits()
