"""The hourly reaper never gives back the gs:// slice lease of a run that is still running: a training that outlives
the lease's expiry has it renewed (its holder and supervisor record kept), and only a run that is over loses it."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.airflow_context import FakeTaskInstance, task_context

from tpuflow import liveness
from tpuflow.paths import gke_lease_root
from tpuflow.slices import leases
from tpuflow_rehearsal.gcs_emulator import ensure_buckets


@pytest.fixture
def output_root(gcs_emulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))  # no local clusters or leases of this machine's
    monkeypatch.delenv(liveness.SUPERVISOR_ENV, raising=False)  # a scheduler's runs: no supervising process
    bucket = f"tpuflow-test-{uuid.uuid4().hex[:10]}"
    ensure_buckets(gcs_emulator.url, [bucket])
    return f"gs://{bucket}/out"


def _expired_lease(root: str, holder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(leases, "LEASE_TTL_S", -1.0)  # taken long ago: already past its expiry
        assert leases.lease_store(root).try_acquire(holder, 2) is not None


def _reap(output_root: str, states: dict[str, dict[str, str]], dry_run: bool = False) -> dict[str, Any]:
    from tpuflow.cost.operators import TPUReapOrphansOperator

    ti = FakeTaskInstance(dag_id="tpuflow_reaper", task_id="reap", task_states={"train_dag": states})
    reaper = TPUReapOrphansOperator(
        task_id="reap", dag_ids=["train_dag"], older_than="0s", output_root=output_root, dry_run=dry_run
    )
    return reaper.execute(task_context(ti))


def test_the_reaper_renews_the_expired_lease_of_a_running_run_and_frees_a_finished_ones(
    output_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = gke_lease_root(output_root)
    _expired_lease(root, "train_dag/long", monkeypatch)
    _expired_lease(root, "train_dag/done", monkeypatch)
    states = {"long": {"train": "running"}, "done": {"train": "success"}}

    dry = _reap(output_root, states, dry_run=True)
    assert dry["deleted"] == [] and not dry.get("renewed")
    assert {lease.holder for lease in leases.lease_store(root).holders(2).values()} == {
        "train_dag/long",
        "train_dag/done",
    }

    outcome = _reap(output_root, states)
    held = leases.lease_store(root).holders(2)
    assert [lease.holder for lease in held.values()] == ["train_dag/long"], outcome
    (lease,) = held.values()
    assert lease.expires_at is not None and lease.expires_at > time.time() + leases.LEASE_TTL_S - 60
    assert lease.dead_reason() is None
    assert outcome["deleted"] and all("train_dag/done" in line for line in outcome["deleted"]), outcome
    assert [line.split(": ")[0] for line in outcome["renewed"]] == [f"lease slot {lease.slot} ({root})"]
