"""The one task-instance double and execute() context builder of the tests.

Operators read the running task instance's identity (dag_id, run_id, task_id, map_index), its
try_number, and push XComs; the Ray job operators also keep state in the task state store Airflow
gives each task instance across tries. Nothing else of Airflow's context is faked here.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

_runs = itertools.count()


@dataclass
class FakeTaskInstance:
    """The parts of a running task instance the operators use. XCom pushes are recorded in ``xcoms``
    and must be JSON (as Airflow's XCom backend requires); the same identity is the same task
    instance, so a new one with a higher ``try_number`` is a retry."""

    dag_id: str = "tpuflow_tests"
    run_id: str = "manual__2026-11-29T10:00:00+00:00"
    task_id: str = "task"
    map_index: int = -1
    try_number: int = 1
    xcoms: dict[str, Any] = field(default_factory=dict)
    # Other runs' states as the Task SDK reports them ("DAG_ID/RUN_ID" -> state; None: deleted from the DB).
    run_states: dict[str, str | None] = field(default_factory=dict)
    # A DAG's task states by run, as the Task SDK's get_task_states answers (DAG_ID -> RUN_ID -> task -> state).
    task_states: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)

    def get_task_states(self, dag_id: str) -> dict[str, dict[str, str]]:
        return self.task_states.get(dag_id, {})

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        state = self.run_states.get(f"{dag_id}/{run_id}", "running")
        if state is None:  # what the Task SDK raises for a run the API server does not know
            raise RuntimeError(f"API_SERVER_ERROR: {{'status_code': 404, 'message': 'DagRun {run_id} not found'}}")
        return state

    def xcom_push(self, key: str, value: Any) -> None:
        json.dumps(value)  # raises TypeError for what XCom could not store
        self.xcoms[key] = value

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value") -> Any:
        """What this task instance pushed under ``key`` (the double knows no other task's XComs)."""
        if task_ids not in (None, self.task_id):
            raise LookupError(f"FakeTaskInstance {self.task_id!r} holds only its own XComs, not {task_ids!r}'s")
        return self.xcoms.get(key)


class TaskStateStore(dict):
    """The task state store's get/set (Airflow keeps it per task instance across tries)."""

    def set(self, key: str, value: Any) -> None:
        self[key] = value


def task_context(ti: FakeTaskInstance | None = None, /, **identity: Any) -> dict[str, Any]:
    """An execute() context for ``ti``, or for a new FakeTaskInstance(**identity)."""
    if ti is None:
        ti = FakeTaskInstance(**identity)
    elif identity:
        raise TypeError("pass a task instance or its identity fields, not both")
    return {"ti": ti, "task_instance": ti, "task_state_store": TaskStateStore()}


def new_run_id() -> str:
    """A run id no other context of this session (or an earlier session's cluster) has used."""
    return f"run-{next(_runs)}-{uuid.uuid4().hex[:6]}"
