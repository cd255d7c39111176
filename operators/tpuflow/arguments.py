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
            self.check_static_arguments()  # last line of __init__

        def execute(self, context):
            self.validate_arguments()  # first line of execute
"""

from __future__ import annotations

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


class ArgumentChecks:
    """The mixin: ``argument_checks()`` lists the checks; the two moments run them."""

    def argument_checks(self) -> list[ArgumentCheck]:
        """Every check of this operator's arguments, with the values it reads (subclasses extend it)."""
        return []

    def validate_arguments(self, *, static_only: bool = False) -> None:
        """Raise UserInputError for the first bad argument; ``static_only``: skip checks of templated values."""
        for values, check in self.argument_checks():
            if not (static_only and any(is_templated(value) for value in values)):
                check()

    def check_static_arguments(self) -> None:
        """The parse-time step (the last line of each operator's ``__init__``): static values only."""
        self.validate_arguments(static_only=True)
