"""The base of every tpuflow trigger: plain-JSON kwargs serialised under the trigger's classpath.

Triggers live in the installed package (the triggerer imports them by classpath, never from the
DAGs folder). A subclass lists the constructor arguments it serialises in ``serialize_fields``;
they must be plain JSON values (deadlines as epoch seconds, targets as dicts). Each trigger runs
one wait coroutine and fires one event of the shape in ``tpuflow.events``.

A wait whose success needs no further work ends its task in the triggerer: the operator passes
``end_task`` (the XComs its ``execute_complete`` would return, worked out before it defers) and
the trigger fires ``TaskEndedEvent`` instead of resuming the task on a worker. Everything else
(failures, timeouts, a success that still has work to do) resumes ``execute_complete`` as before,
so retries and non-retryable failures keep their one home in ``tpuflow.events.raise_for_event``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent


class TaskEndedEvent(TaskSuccessEvent):
    """Ends the task as successful in the triggerer; no worker process resumes it.

    ``payload`` is the wait's own event: ``dag.test()`` (``airflow dags test``, ``tpuflow demo``)
    runs triggers in line and resumes the task with the payload whatever the event's type, so there
    the operator's ``execute_complete`` reads the same event as before and returns the same value.
    The triggerer sends only the state (``TaskSuccessEvent``'s own serialisation).
    """

    def __init__(self, event: Mapping[str, Any]) -> None:
        super().__init__()
        self.payload = dict(event)


class TpuflowTrigger(BaseTrigger):
    serialize_fields: ClassVar[tuple[str, ...]] = ()
    # {"xcoms": {key: value}, ...}: end the task here on success; None: resume it on a worker.
    end_task: dict[str, Any] | None = None

    def __init__(self) -> None:
        # typed once here for every trigger's super().__init__(): Airflow's BaseTrigger.__init__ is unannotated
        super().__init__()  # type: ignore[no-untyped-call]

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {name: getattr(self, name) for name in self.serialize_fields},
        )

    def xcom_address(self) -> dict[str, Any] | None:
        """Where the deferred task's XComs live (set by the triggerer); None when the trigger runs on its own."""
        ti = self.task_instance
        if ti is None:
            return None
        return {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": ti.map_index}

    async def event(self, payload: Mapping[str, Any]) -> TriggerEvent:
        """The event that ends the wait: ``TaskEndedEvent`` for a success that ``task_end_xcoms`` finds
        final once its XComs are stored, else the payload for the operator's ``execute_complete``."""
        if self.end_task is not None and payload.get("status") == "success":
            xcoms = self.task_end_xcoms(payload)
            if xcoms is not None and await self._push(xcoms):
                return TaskEndedEvent(payload)
        return TriggerEvent(dict(payload))

    def task_end_xcoms(self, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """The XComs of a task ended by this success; None: its operator still has work to do."""
        return dict((self.end_task or {}).get("xcoms") or {})

    async def _push(self, xcoms: Mapping[str, Any]) -> bool:
        """Store the task's XComs through the Task SDK, as its worker would; False: they could not be
        stored, and the task resumes on a worker instead.

        Not ``TaskSuccessEvent(xcoms=...)``: Airflow 3.3's triggerer stores those with
        ``XComModel.set(serialize=True)``, a JSON string inside the JSON column, so a downstream
        ``xcom_pull`` would get a string where a worker's push gives the dict.
        """
        where = self.xcom_address()
        if where is None:  # run in line (dag.test, tests): the payload resumes the operator, which pushes
            return True
        from airflow.sdk.execution_time.xcom import XCom

        try:  # at once: the triggerer's supervisor answers between the database work of its loop, so each
            # request sent in turn would wait for one more of its loops
            await asyncio.gather(*(XCom.aset(key, value, **where) for key, value in xcoms.items()))
        except Exception as err:
            self.log.warning("Could not store the task's XComs (%s); the task resumes on a worker", err)
            return False
        return True


def may_end_in_triggerer(operator: Any) -> bool:
    """Whether ``operator``'s task may be ended by its trigger: not when a mapped task expands over its
    return value or it has ``multiple_outputs`` (the worker's XCom push does that bookkeeping), nor when it
    has ``outlets`` (the worker records their asset events; a task ended in the triggerer records none)."""
    if getattr(operator, "multiple_outputs", False) or getattr(operator, "outlets", None):
        return False
    # outside a DAG (an operator driven by hand) nothing can expand over it
    return not operator.has_dag() or next(operator.iter_mapped_dependants(), None) is None


def task_end(operator: Any, return_value: Any) -> dict[str, Any] | None:
    """A trigger's ``end_task`` for an operator whose task is done once the wait succeeds, with
    ``return_value`` (worked out before it defers) as its value; None where it may not end there."""
    if not may_end_in_triggerer(operator):
        return None
    return {"xcoms": {"return_value": return_value} if operator.do_xcom_push and return_value is not None else {}}
