"""The GKE stand-in with an Airflow connection to it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support.gke_standin import CLUSTER_PATH, CONN_ID, PROJECT
from tpuflow.dev.standins.gke_api import GKEApiStandin


@pytest.fixture
def gke(monkeypatch: pytest.MonkeyPatch) -> Iterator[GKEApiStandin]:
    standin = GKEApiStandin(operation_seconds=0.3, clusters=[CLUSTER_PATH])
    standin.start()
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(standin.airflow_connection(PROJECT)))
    try:
        yield standin
    finally:
        standin.stop()
