"""One argument-check shape for every operator: each check is listed once with the values it reads, and
runs twice: at parse time when every value it reads is static (a bad literal fails the DAG import), and at
the start of ``execute`` on the rendered values (before anything billable). An error is the check's
``UserInputError``: one line naming the field, the value and the fix.

    class MyOperator(ArgumentChecks, BaseOperator):
        def argument_checks(self) -> list[ArgumentCheck]:
            return [*super().argument_checks(), ((self.size,), lambda: check_count("size", self.size))]

        def __init__(self, ..., **kwargs):
            super().__init__(**kwargs)
            self.size = size

        def execute(self, context):
            self.validate_arguments()  # first line of execute

The parse-time run needs no call: it follows the outermost ``__init__`` of the instance's class, so a
subclass (the team's own, with its own ``__init__``) has every attribute set before any check reads it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tpuflow.templating import is_templated

# (the values a check reads, the check): run at parse time when every value is static, always in execute
ArgumentCheck = tuple[tuple[Any, ...], Callable[[], object]]


class _RunTime:
    """What only the running task can read (the worker's files, the cluster it is handed): never static."""

    def __repr__(self) -> str:
        return "RUN_TIME"


# Among a check's values: the check runs only at the start of execute, never when the DAG is parsed.
RUN_TIME: Any = _RunTime()


# The instance's __dict__ key counting the __init__ calls under way (one per class of the chain that has one).
_INIT_DEPTH = "_argument_checks_init_depth"


def _checks_after_outermost(init: Callable[..., None]) -> Callable[..., None]:
    """``init``, followed by the parse-time checks when it is the outermost ``__init__`` call of the instance.

    Airflow's own ``apply_defaults`` tells the outermost call by comparing functions; a depth count also holds
    when a subclass calls ``super().__init__`` from a helper or a mixin sits between the classes."""

    @functools.wraps(init)
    def __init__(self: ArgumentChecks, *args: Any, **kwargs: Any) -> None:
        state = vars(self)
        state[_INIT_DEPTH] = state.get(_INIT_DEPTH, 0) + 1
        try:
            init(self, *args, **kwargs)
        finally:
            state[_INIT_DEPTH] -= 1
            outermost = state[_INIT_DEPTH] == 0
            if outermost:
                del state[_INIT_DEPTH]
        if outermost:
            self.check_static_arguments()

    __init__._checks_after_outermost = True  # type: ignore[attr-defined]
    return __init__


class ArgumentChecks:
    """The mixin: ``argument_checks()`` lists the checks; the two moments run them."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_checks_after_outermost", False):
            cls.__init__ = _checks_after_outermost(init)  # type: ignore[method-assign]

    def argument_checks(self) -> list[ArgumentCheck]:
        """Every check of this operator's arguments, with the values it reads (subclasses extend it)."""
        return []

    def validate_arguments(self, *, static_only: bool = False) -> None:
        """Raise UserInputError for the first bad argument; ``static_only``: skip checks of templated values."""
        for values, check in self.argument_checks():
            if not (static_only and any(is_templated(value) for value in values)):
                check()

    def check_static_arguments(self) -> None:
        """The parse-time step (after the outermost ``__init__``, on its own): static values only."""
        self.validate_arguments(static_only=True)
