"""The GKE stand-in with an Airflow connection to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.gke_standin import connected_standin

from tpuflow_rehearsal.standins.gke_api import GKEApiStandin


@pytest.fixture
def gke(monkeypatch: pytest.MonkeyPatch) -> Iterator[GKEApiStandin]:
    with connected_standin(monkeypatch, operation_seconds=0.3) as standin:
        yield standin
