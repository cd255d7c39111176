"""A setup task's own undo when it fails for good.

Airflow runs a teardown only when at least one of its setups succeeded (trigger rule ALL_DONE_SETUP_SUCCESS), so a
team's ``create >> ... >> delete.as_teardown(setups=create)`` never deletes what a *failed* create made: a
RayCluster whose wait timed out, or a create that raised after its object existed, kept its TPU slice (and
took the next run's slice nodes) until the reaper came. A create operator therefore undoes itself in an
``on_failure_callback``: Airflow calls it once no try is left (a retry calls ``on_retry_callback`` instead, and
adopts the object), in the worker or, for a task the scheduler failed, in the DAG processor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator


def chain_on_failure(task: BaseOperator, callback: Callable[[Any], None]) -> None:
    """Run ``callback(context)`` after the task's own ``on_failure_callback``\\ (s), the user's or default_args'."""
    # Airflow keeps a list, but a DAG author may have set a single callable (or None) after construction
    existing: Sequence[Callable[[Any], None]] | Callable[[Any], None] | None = task.on_failure_callback
    own: list[Callable[[Any], None]] = [] if existing is None else [existing] if callable(existing) else list(existing)
    task.on_failure_callback = [*own, callback]
