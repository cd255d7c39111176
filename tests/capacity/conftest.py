"""Fixtures for the capacity tests: the GKE API stand-in and an Airflow connection to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.gke_standin import connected_standin

from tpuflow_rehearsal.standins.gke_api import GKEApiStandin


@pytest.fixture
def gke(monkeypatch: pytest.MonkeyPatch) -> Iterator[GKEApiStandin]:
    """A running stand-in (0.2 s per operation) and the Airflow connection ``gke_standin`` to it."""
    with connected_standin(monkeypatch, operation_seconds=0.2) as standin:
        yield standin
