"""A task instance double that also sees other tasks' XComs (the ledger, the budget guard and the
budgeted train task read the create tasks' pool names and the previous run's ledger)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from support.airflow_context import FakeTaskInstance


@dataclass
class RunTaskInstance(FakeTaskInstance):
    """FakeTaskInstance of one DAG run whose other tasks' XComs are given as {(task_id, key): value}."""

    others: dict[tuple[str, str], Any] = field(default_factory=dict)
    prior: dict[str, Any] = field(default_factory=dict)  # task_id -> a previous run's return value

    def xcom_pull(  # type: ignore[override]
        self, task_ids: str | None = None, key: str = "return_value", include_prior_dates: bool = False
    ) -> Any:
        if task_ids in (None, self.task_id):
            return self.xcoms.get(key)
        if (task_ids, key) in self.others:
            return self.others[(task_ids, key)]
        return self.prior.get(task_ids) if include_prior_dates else None
