"""A minimal task-instance context so operators run against the real cluster without a scheduler."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

JOBS = Path(__file__).parent / "jobs"
_runs = itertools.count()


@dataclass
class FakeTI:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    try_number: int = 1
    xcoms: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


class TaskStateStore(dict):
    """The task state store's get/set (Airflow keeps it per task instance across tries)."""

    def set(self, key: str, value: Any) -> None:
        self[key] = value


@pytest.fixture
def task_context():
    def make(task_id: str = "job", run_id: str | None = None) -> dict[str, Any]:
        ti = FakeTI("rayjob_tests", run_id or f"run-{next(_runs)}", task_id)
        return {"ti": ti, "task_instance": ti, "task_state_store": TaskStateStore()}

    return make
