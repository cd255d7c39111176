"""Fixtures of the CLI tests."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """Fail the test if the command starts a process (Airflow, stand-ins, Ray, an emulator); what it tried to
    start is listed. TPUFLOW_HOME is the test's own, so no cluster or lease of another run is seen."""
    started: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        started.append(args)
        raise AssertionError(f"a bad input started {args!r}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    from tpuflow.local.cluster import LocalRayCluster

    monkeypatch.setattr(LocalRayCluster, "start", classmethod(refuse))
    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))
    return started
