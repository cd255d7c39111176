"""`tpuflow reap` after a killed `tpuflow demo`, from a plain shell: without an Airflow metadata DB it reaps
the local cluster and lease whose supervising process is provably dead (stops its processes, removes its
state folder, frees the lease), whatever their age, and keeps those of a live supervisor."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.local_clusters import supervised_cluster
from support.processes import dead_process_record

from tpuflow import liveness
from tpuflow.slices.leases import LocalLeaseStore


def _lease(root: Path, holder: str, supervisor: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setenv(liveness.SUPERVISOR_ENV, json.dumps(supervisor))
        assert LocalLeaseStore(root).try_acquire(holder, 2) is not None


def test_reap_without_a_db_takes_what_a_dead_supervisor_left_and_keeps_a_live_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tpuflow.cli import main

    base, leases = tmp_path / "clusters", tmp_path / "leases"
    killed, killed_head = supervised_cluster(base, "killed", dead_process_record())
    live, live_head = supervised_cluster(base, "live", liveness.process_record())
    _lease(leases, "dag/killed", dead_process_record(), monkeypatch)
    _lease(leases, "dag/live", liveness.process_record(), monkeypatch)
    try:
        code = main(["reap", "--without-db", "--base-dir", str(base), "--lease-root", str(leases)])
        out = capsys.readouterr().out
        assert code == 0, out
        assert f"deleted local_cluster {killed.name}" in out and "the process that supervised its run is gone" in out
        assert "deleted lease slot 0" in out and "held by dag/killed (pid" in out
        assert killed_head.wait(timeout=10) is not None  # its processes stopped
        assert not Path(killed.state_dir).exists()  # its state folder removed
        assert live_head.poll() is None and Path(live.state_dir, "state.json").exists()  # a live run's kept
        assert [lease.holder for lease in LocalLeaseStore(leases).all_holders().values()] == ["dag/live"]
    finally:
        for head in (killed_head, live_head):
            if head.poll() is None:
                os.killpg(head.pid, 9)
                head.wait()


def test_reap_falls_back_to_supervisors_when_the_metadata_db_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tpuflow.cli import main
    from tpuflow.cost import reaper

    def no_db(self: Any) -> dict[str, list[str]]:
        raise reaper.ReaperListError("reading running DAG runs from the Airflow metadata DB: no such table: dag_run")

    monkeypatch.setattr(reaper.MetadataDbRunStates, "running", no_db)
    leases = tmp_path / "leases"
    _lease(leases, "dag/killed", dead_process_record(), monkeypatch)
    _lease(leases, "dag/unknown", {}, monkeypatch)  # no supervisor: its run may be live, kept
    code = main(["reap", "--base-dir", str(tmp_path / "clusters"), "--lease-root", str(leases)])
    captured = capsys.readouterr()
    assert code == 0
    assert "no Airflow metadata DB to read" in captured.err and "nothing deleted" not in captured.err
    assert [lease.holder for lease in LocalLeaseStore(leases).all_holders().values()] == ["dag/unknown"]


def test_a_run_the_db_lists_as_running_is_reaped_when_its_supervisor_is_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pointed at the killed demo's own DB (its run still 'running' there), the dead supervisor decides."""
    from tpuflow.cost.reaper import FixedRunStates, ReaperScope, collect_orphans

    leases = tmp_path / "leases"
    _lease(leases, "dag/killed", dead_process_record(), monkeypatch)
    killed, head = supervised_cluster(tmp_path / "clusters", "killed", dead_process_record())
    try:
        scope = ReaperScope(local_base_dir=str(tmp_path / "clusters"), lease_root=str(leases), kube=False)
        orphans = collect_orphans(scope, FixedRunStates({"dag": ["killed"]}), older_than=7200)
        assert sorted((o.kind, o.name) for o in orphans) == [("lease", "slot 0"), ("local_cluster", killed.name)]
        assert all("exited" in o.reason for o in orphans)
    finally:
        os.killpg(head.pid, 9)
        head.wait()


def _args(**flags: Any) -> Any:
    import argparse

    names = ("project", "location", "cluster", "kubernetes_conn_id", "namespace", "gcp_conn_id", "output_root")
    return argparse.Namespace(**{**dict.fromkeys(names), "lease_root": None, "base_dir": None, **flags})


def test_where_reap_looks_on_gke_comes_from_the_shells_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain shell with the GKE pipeline's Variables exported (what `tpuflow standins env` prints) reaps that
    cluster and its lease root without a flag; a flag overrides its Variable; no GKE Variable: local only."""
    from tpuflow.cli.reap_cmd import _configured_gke, _scopes

    for name in [k for k in os.environ if k.startswith("AIRFLOW_VAR_")]:
        monkeypatch.delenv(name)
    assert _configured_gke(_args()) is None and [s.gke for s, _ in _scopes(_args())] == [False]
    for name, value in {
        "TPUFLOW_BACKEND": "gke",
        "TPUFLOW_GKE_PROJECT": "acme-ml",
        "TPUFLOW_GKE_LOCATION": "us-east5-b",
        "TPUFLOW_GKE_CLUSTER": "training",
        "TPUFLOW_KUBERNETES_CONN_ID": "acme_kube",
        "TPUFLOW_GKE_OUTPUT_ROOT": "gs://acme-runs/outputs",
    }.items():
        monkeypatch.setenv(f"AIRFLOW_VAR_{name}", value)
    gke = _configured_gke(_args(cluster="other"))
    assert gke == {
        "gcp_conn_id": "google_cloud_default",
        "project_id": "acme-ml",
        "location": "us-east5-b",
        "cluster_name": "other",
        "kubernetes_conn_id": "acme_kube",
        "namespace": None,
        "output_root": "gs://acme-runs/outputs",
        "lease_root": "gs://acme-runs/outputs/_tpuflow/slice-leases",
    }
    (gke_scope, root), (local_scope, _) = _scopes(_args())
    assert gke_scope.gke and not gke_scope.local and gke_scope.lease_root.endswith("/_tpuflow/slice-leases")
    assert root == "gs://acme-runs/outputs" and local_scope.local and not local_scope.kube
