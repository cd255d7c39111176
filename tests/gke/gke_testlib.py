"""Shared constants and the task-instance double for the GKE tests (a uniquely named module, so
test files can import it whatever else is on sys.path)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROJECT = "tpu-proj-123"
ZONE = "us-east5-b"
CLUSTER = "tpu-cluster"
CLUSTER_PATH = f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}"
CONN_ID = "gke_standin"


@dataclass
class FakeTaskInstance:
    """The parts of a running task instance the operators use: identity and xcom_push."""

    dag_id: str = "train_dag"
    run_id: str = "manual__2026-11-29T10:00:00+00:00"
    task_id: str = "create_pool"
    map_index: int = -1
    try_number: int = 1
    xcom: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def context(**identity: Any) -> dict[str, Any]:
    """A minimal execute() context: the same identity is the same task instance (a retry)."""
    return {"ti": FakeTaskInstance(**identity)}
