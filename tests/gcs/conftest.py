"""A real GCS server on loopback (fake-gcs-server through `tpuflow_rehearsal.gcs_emulator`), once per session.

The emulator runs on a free port and is stopped by its PID. In every test of this folder
STORAGE_EMULATOR_HOST names it, as `tpuflow local gcs up` tells a user to export it (only here:
the rest of the session keeps its own environment). No storage is mocked.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from support.ray_cluster import running_cluster

from tpuflow_rehearsal.gcs_emulator import EMULATOR_ENV, GcsEmulator, ensure_buckets


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


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory, gcs_emulator: GcsEmulator) -> Iterator:
    """One simulated v6e 2x2 slice (one TPU host), started after the emulator."""
    with running_cluster("pytest-gcs", tmp_path_factory.mktemp("gcs-cluster"), "TPU-V6E", "2x2") as cluster:
        yield cluster
