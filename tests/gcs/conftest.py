"""A real GCS server on loopback (fake-gcs-server through `tpuflow.dev.gcs_emulator`), once per session.

The emulator runs on a free port and is stopped by its PID. In every test of this folder
STORAGE_EMULATOR_HOST names it, as `tpuflow local gcs up` tells a user to export it (only here:
the rest of the session keeps its own environment). No storage is mocked.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tpuflow.dev.gcs_emulator import EMULATOR_ENV, GcsEmulator, ensure_buckets

_runs = itertools.count()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    emulator = GcsEmulator.start(state_dir=tmp_path_factory.mktemp("gcs-emulator"))
    try:
        yield emulator
    finally:
        assert emulator.stop(), "the emulator died during the session"
        assert not emulator.is_alive()


@pytest.fixture(autouse=True)
def emulator_env(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)
    return gcs_emulator.url


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator) -> str:
    """A fresh bucket on the emulator for one test."""
    name = f"tpuflow-test-{uuid.uuid4().hex[:10]}"
    ensure_buckets(gcs_emulator.url, [name])
    return name


@pytest.fixture
def emulator_at(monkeypatch: pytest.MonkeyPatch):
    """Point this process's clients at another address (the fault proxy) for one test."""

    def point(url: str) -> None:
        monkeypatch.setenv(EMULATOR_ENV, url)

    return point


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
    def set(self, key: str, value: Any) -> None:
        self[key] = value


@pytest.fixture
def task_context():
    def make(task_id: str = "job", run_id: str | None = None) -> dict[str, Any]:
        ti = FakeTI("gcs_tests", run_id or f"run-{next(_runs)}-{uuid.uuid4().hex[:6]}", task_id)
        return {"ti": ti, "task_instance": ti, "task_state_store": TaskStateStore()}

    return make


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory, gcs_emulator: GcsEmulator) -> Iterator:
    """One simulated v6e 2x2 slice (one TPU host), started after the emulator."""
    from tpuflow.local.cluster import LocalRayCluster
    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec("TPU-V6E", "2x2")
    base: Path = tmp_path_factory.mktemp("gcs-cluster")
    cluster = LocalRayCluster.start(tpu, "pytest-gcs", base, head_cpus=2, timeout=600)
    try:
        yield cluster
    finally:
        cluster.stop()
