"""A run killed with SIGKILL leaves its GKE resources to the reaper (issue 45): each run records its supervising
process beside the slice leases (tpuflow.slices.supervision), and every node pool, RayCluster, RayService and
workload policy of a run whose supervisor is provably dead is an orphan, whatever the metadata DB still says of the
run, whatever DAG it is and however young. Its node pools' chip time goes to a ledger entry in the run's folder."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cost_support import pool_body
from support.airflow_context import task_context
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE
from support.processes import dead_process_record

from tpuflow import liveness
from tpuflow.cost.reaper import (
    REAPED_LEDGER_FILE,
    FixedRunStates,
    OwnerUnreadable,
    ReaperScope,
    SupervisorGone,
    collect_orphans,
    kube_orphan_reason,
    pool_bill,
    pool_orphan_reason,
    reap,
    settle_dead_runs,
)
from tpuflow.labels import (
    kept_labels,
    kubernetes_ownership_annotations,
    kubernetes_ownership_labels,
)
from tpuflow.naming import TaskIdentity, owner_run_digest
from tpuflow.slices.supervision import SupervisionStore, dead_runs
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, KubeRayStandin
from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS

# a team's DAG (not the shipped ones), which no run state covers
DAG = "acme_forecast_daily"
KILLED, LIVE = "manual__2026-12-05T00:00:00+00:00", "manual__2026-12-06T00:00:00+00:00"
KILLED_DIGEST = owner_run_digest(DAG, KILLED)


def pool_labels(run_id: str, task: str = "create_node_pool") -> dict[str, str]:
    from tpuflow.labels import gce_ownership_labels

    return gce_ownership_labels(TaskIdentity(DAG, run_id, task), int(time.time() + 3600))


def test_the_store_keeps_one_record_per_run_the_newest_try_wins(tmp_path: Path) -> None:
    store = SupervisionStore(str(tmp_path))
    dead = dead_process_record()
    store.record(DAG, KILLED, "2026-12-05", dead)
    assert dead_runs(store)[KILLED_DIGEST][1].startswith(f"pid {dead['pid']}")
    # a rerun of the same run by a live process re-stamps it: nothing of it is an orphan any more
    store.record(DAG, KILLED, "2026-12-05", liveness.process_record())
    assert dead_runs(store) == {} and store.get(KILLED_DIGEST).date == "2026-12-05"  # type: ignore[union-attr]
    # what is no record (another file, a record under another run's name) is never acted on
    (tmp_path / "supervisors" / "junk.json").write_text("{not json")
    other = owner_run_digest(DAG, LIVE)
    (tmp_path / "supervisors" / f"{other}.json").write_text(store.get(KILLED_DIGEST).to_json())  # type: ignore[union-attr]
    assert set(store.all()) == {KILLED_DIGEST} and store.get(other) is None
    store.forget(KILLED_DIGEST)
    assert store.get(KILLED_DIGEST) is None


def test_the_acquire_task_records_its_runs_supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuflow.slices.operators import TPUAcquireSliceOperator

    me = liveness.process_record()
    monkeypatch.setenv(liveness.SUPERVISOR_ENV, json.dumps(me))
    acquire = TPUAcquireSliceOperator(task_id="acquire_slice", lease_root=str(tmp_path), max_slices="1")
    acquire.execute(task_context(dag_id=DAG, run_id=KILLED))
    entry = SupervisionStore(str(tmp_path)).get(KILLED_DIGEST)
    assert entry is not None and entry.supervisor == me and (entry.dag_id, entry.run_id) == (DAG, KILLED)


def test_a_dead_supervisor_makes_an_orphan_whatever_the_run_state_and_coverage() -> None:
    dead = {KILLED_DIGEST: "pid 4242 exited"}
    running = {DAG: [KILLED]}  # the DB still says running: `airflow dags test` was killed, nothing ended the run
    reason = pool_orphan_reason(pool_labels(KILLED), running, time.time(), covered=[], dead=dead)
    assert isinstance(reason, SupervisorGone) and "pid 4242 exited" in reason
    assert pool_orphan_reason(pool_labels(LIVE), running, time.time(), covered=[], dead=dead) is None
    # kept on purpose (keep_endpoint) stays kept; an owner that cannot be read is still never deleted
    assert pool_orphan_reason(kept_labels(pool_labels(KILLED)), running, time.time(), dead=dead) is None
    labels = {**pool_labels(KILLED), "tpuflow-owner-dag": "x"}
    assert isinstance(pool_orphan_reason(labels, running, time.time(), dead=dead), OwnerUnreadable)
    identity = TaskIdentity(DAG, KILLED, "create_ray_cluster", 3)  # a mapped task's object: the run decides
    kube = kube_orphan_reason(
        kubernetes_ownership_labels(identity), running, [], None, kubernetes_ownership_annotations(identity), dead
    )
    assert isinstance(kube, SupervisorGone)


def test_a_pools_bill_is_its_nodes_chips() -> None:
    pool = {"initialNodeCount": 4, "config": {"machineType": "ct6e-standard-4t", "resourceLabels": pool_labels(KILLED)}}
    assert pool_bill(pool, 100.0) == {"chips": 16, "generation": "v6e", "created_at": 100.0, "role": "create_node_pool"}
    assert pool_bill({"config": {"machineType": "e2-standard-4"}}, None) is None


def test_a_killed_runs_young_pool_and_raycluster_are_reaped_and_billed(
    gke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases, outputs = tmp_path / "leases", tmp_path / "outputs"
    store = SupervisionStore(str(leases))
    store.record(DAG, KILLED, "2026-12-05", dead_process_record())
    store.record(DAG, LIVE, "2026-12-06", liveness.process_record())
    kube = KubeRayStandin(tmp_path / "kube", launcher=FakeRayLauncher(), interval=0.05)
    with kube:
        for key, value in kube.connection_env("kube_standin").items():
            monkeypatch.setenv(key, value)
        for name, run in (("killed-pool", KILLED), ("live-pool", LIVE)):
            gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body(name, pool_labels(run)))
        for name, run in (("killed-ray", KILLED), ("live-ray", LIVE)):
            identity = TaskIdentity(DAG, run, "create_ray_cluster")
            meta = {
                "name": name,
                "namespace": "default",
                "labels": kubernetes_ownership_labels(identity),
                "annotations": kubernetes_ownership_annotations(identity),
            }
            head = {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": "r"}]}}}
            body = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta, "spec": {"headGroupSpec": head}}
            kube.store.create(RAYCLUSTERS, "default", body, admit=False)
        deadline = time.time() + 30
        while time.time() < deadline and any(p["status"] != "RUNNING" for p in gke.node_pools()):
            time.sleep(0.05)
        scope = ReaperScope(
            gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE, cluster_name=CLUSTER,
            kubernetes_conn_id="kube_standin", local=False, lease_root=str(leases),
        )  # fmt: skip
        # a plain shell: no DB, no DAG covered; the default --older-than (2h) and both resources a minute old
        states = FixedRunStates({}, dag_ids=[])
        said: list[str] = []
        orphans = collect_orphans(scope, states, older_than=7200)
        outcome = reap(orphans, dry_run=False, say=said.append)
        assert sorted(line.split(" (")[0] for line in outcome["deleted"]) == [
            "node_pool killed-pool",
            "raycluster killed-ray",
        ], said
        written = settle_dead_runs(orphans, outcome, output_root=str(outputs), say=said.append)
        # a second run finds nothing
        assert collect_orphans(scope, states, older_than=0) == []
    assert [p["name"] for p in gke.node_pools()] == ["live-pool"]
    (ledger,) = written
    (line,) = ledger["slices"]
    assert line["chips"] == 1 and line["generation"] == "v6e" and line["seconds"] > 0 and not ledger["open"]
    assert ledger["chip_hours"] > 0 and (ledger["dag_id"], ledger["run_id"]) == (DAG, KILLED)
    booked = json.loads((outputs / DAG / "2026-12-05" / REAPED_LEDGER_FILE).read_text())
    assert booked == [ledger] and any("chip-hours until reaped" in s for s in said), said
    # the dead run's record is gone, the live one's kept
    assert set(store.all()) == {owner_run_digest(DAG, LIVE)}


def test_a_dry_run_books_and_forgets_nothing(tmp_path: Path) -> None:
    store = SupervisionStore(str(tmp_path / "leases"))
    store.record(DAG, KILLED, "2026-12-05", dead_process_record())
    orphans = collect_orphans(
        ReaperScope(kube=False, local=False, lease_root=str(tmp_path / "leases")), FixedRunStates({}, []), older_than=0
    )
    assert set(orphans.dead_runs) == {KILLED_DIGEST}
    assert settle_dead_runs(orphans, {"dry_run": True}, output_root=str(tmp_path)) == []
    assert store.get(KILLED_DIGEST) is not None


def test_records_of_finished_runs_are_forgotten_after_a_week(tmp_path: Path) -> None:
    from tpuflow.cost.reaper import RECORD_TTL_S, prune_supervision

    store = SupervisionStore(str(tmp_path))
    store.record(DAG, KILLED, "2026-12-05", None)  # a scheduler's run: no supervising process
    store.record(DAG, LIVE, "2026-12-06", None)
    store.record("another_team", "run", "2026-12-06", None)
    later = time.time() + RECORD_TTL_S + 1
    assert prune_supervision(store, {DAG: [LIVE]}, [DAG], now=time.time()) == []  # younger than a week: kept
    # a week on: the finished run of a covered DAG goes; the running one and an uncovered DAG's stay
    assert prune_supervision(store, {DAG: [LIVE]}, [DAG], now=later) == [f"{DAG}/{KILLED}"]
    assert {e.run_id for e in store.all().values()} == {LIVE, "run"}


def test_the_hourly_reaper_covers_every_dag_with_a_recorded_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No list of DAG ids: a team's DAG whose runs took a slice lease (and so recorded themselves) is judged by its
    runs' states; its finished run's lease is given back. Without the record the DAG is not the reaper's to judge."""
    from support.airflow_context import FakeTaskInstance

    from tpuflow.cost.operators import TPUReapOrphansOperator
    from tpuflow.slices.leases import LocalLeaseStore, default_lease_root

    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TPUFLOW_SLICE_LEASES", raising=False)
    monkeypatch.delenv(liveness.SUPERVISOR_ENV, raising=False)  # a scheduler's run: no supervising process
    leases = LocalLeaseStore(default_lease_root())
    assert leases.try_acquire(f"{DAG}/{KILLED}", 4) is not None
    states = {DAG: {KILLED: {"train": "success"}}}

    def reap_now() -> dict[str, Any]:
        ti = FakeTaskInstance(dag_id="tpuflow_reaper", task_id="reap", task_states=states)
        return TPUReapOrphansOperator(task_id="reap", older_than="0s").execute(task_context(ti))

    assert reap_now()["found"] == [] and len(leases.holders(4)) == 1  # an unknown DAG: left alone
    SupervisionStore(default_lease_root()).record(DAG, KILLED, "2026-12-05", None)
    assert [line.split(": ")[0] for line in reap_now()["deleted"]] == [f"lease slot 0 ({leases.describe()})"]
    assert leases.holders(4) == {}


@pytest.mark.parametrize(
    ("dag_id", "date"), [("../../etc", "2026-12-05"), ("..", "2026-12-05"), (DAG, "../../x"), (DAG, "2026-12-05/..")]
)
def test_a_record_naming_a_path_is_no_record(tmp_path: Path, dag_id: str, date: str) -> None:
    """Someone who can write the lease root cannot steer where the reaper writes a ledger: a record's dag_id and
    date name the run's folder, so one that is not a DAG id and a date is never read back, nor acted on."""
    store = SupervisionStore(str(tmp_path))
    entry = store.record(dag_id, KILLED, date, dead_process_record())
    assert store.get(entry.digest) is None and store.all() == {} and dead_runs(store) == {}
