"""The GKE stand-in's project, zone and cluster the GKE tests use, and their task context."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from support.airflow_context import task_context

PROJECT = "tpu-proj-123"
ZONE = "us-east5-b"
CLUSTER = "tpu-cluster"
CLUSTER_PATH = f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}"
CONN_ID = "gke_standin"
# The node pool create task of one DAG run: the identity every context() starts from.
CREATE_POOL_TASK = {"dag_id": "train_dag", "run_id": "manual__2026-11-29T10:00:00+00:00", "task_id": "create_pool"}


def context(**identity: Any) -> dict[str, Any]:
    """An execute() context for CREATE_POOL_TASK with ``identity`` fields overridden: the same identity
    is the same task instance (a retry)."""
    return task_context(**{**CREATE_POOL_TASK, **identity})


@contextmanager
def connected_standin(monkeypatch: pytest.MonkeyPatch, operation_seconds: float) -> Iterator[Any]:
    """A running GKE stand-in serving CLUSTER_PATH and the Airflow connection CONN_ID to it."""
    from tpuflow_rehearsal.standins.gke_api import GKEApiStandin

    standin = GKEApiStandin(operation_seconds=operation_seconds, clusters=[CLUSTER_PATH])
    standin.start()
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(standin.airflow_connection(PROJECT)))
    try:
        yield standin
    finally:
        standin.stop()
