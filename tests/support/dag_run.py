"""The tasks of one DAG run executed in order, each seeing the return values of the run's earlier tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from support.airflow_context import FakeTaskInstance, task_context

RUN = {"dag_id": "capacity_dag", "run_id": "manual__2026-12-01T10:00:00+00:00"}


@dataclass
class RunTI(FakeTaskInstance):
    """A task instance of one run that also sees the return values of the run's other tasks."""

    run: dict[str, Any] = field(default_factory=dict)

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value") -> Any:
        if task_ids not in (None, self.task_id) and key == "return_value":
            return self.run.get(task_ids)
        return super().xcom_pull(task_ids, key)


class Run:
    """Executes tasks of one DAG run in order, keeping their return values for the later ones."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def execute(self, op: Any) -> Any:
        ctx = task_context(RunTI(**RUN, task_id=op.task_id, run=self.results))
        self.results[op.task_id] = result = op.execute(ctx)
        return result
