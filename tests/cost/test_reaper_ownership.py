"""The reaper judges every resource by the exact owner it records (dag, run, task, map index), never by a name
rebuilt from ids or a label value two ids share; a resource whose owner cannot be read is reported, never deleted."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cost_support import dead_local_cluster, live_head, pool_body
from support.airflow_context import task_context
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE

from tpuflow.cost.reaper import (
    FixedRunStates,
    OwnerUnreadable,
    ReaperScope,
    collect_orphans,
    find_kube_orphans,
    find_local_orphans,
    kube_orphan_reason,
    local_orphan_reason,
    policy_orphan_reason,
    pool_orphan_reason,
    reap,
)
from tpuflow.kuberay.operators import KubeRayCreateClusterOperator
from tpuflow.labels import (
    GCE_DAG_LABEL,
    GCE_MANAGED_LABEL,
    GCE_RUN_LABEL,
    OWNER_ANNOTATION,
    check_gce_labels,
    check_labels,
    gce_ownership_labels,
    kubernetes_ownership_annotations,
    kubernetes_ownership_labels,
)
from tpuflow.local.cluster import LocalRayCluster, NodeProcess
from tpuflow.local.operators import local_cluster_name
from tpuflow.naming import TaskIdentity, owner_dag_digest, owner_run_digest
from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, KubeRayStandin
from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS

DAG = "tpu_llm_pipeline_local"
LIVE_RUN, DONE_RUN = "manual__2026-12-03T10:00:00+00:00", "scheduled__2026-12-02T00:00:00+00:00"
# a task id inside nested TaskGroups: 90 characters, over a label value's 63
GROUPED_TASK = "training_stage.provisioning_group.ray_cluster_setup_group.create_ray_cluster_for_the_model"


# --- the record ---------------------------------------------------------------------------------------------
def test_the_owner_record_round_trips_and_a_malformed_one_reads_as_none() -> None:
    identity = TaskIdentity("team.a", LIVE_RUN, GROUPED_TASK, map_index=3)
    record = identity.record()
    assert record == {"dag_id": "team.a", "run_id": LIVE_RUN, "task_id": GROUPED_TASK, "map_index": 3}
    assert TaskIdentity.from_record(record) == identity
    assert TaskIdentity.from_record(json.dumps(record)) == identity  # an annotation's text
    assert TaskIdentity.from_record(kubernetes_ownership_annotations(identity)[OWNER_ANNOTATION]) == identity
    for bad in (
        None,
        "",
        "not json",
        "[1, 2]",
        {},
        {**record, "map_index": "3"},
        {**record, "map_index": True},
        {**record, "map_index": -2},
        {**record, "dag_id": ""},
        {**record, "run_id": 7},
        {k: v for k, v in record.items() if k != "task_id"},
        {**record, "extra": 1},
    ):
        assert TaskIdentity.from_record(bad) is None, bad


def test_owner_digests_are_exact_and_fit_both_label_systems() -> None:
    """``team.a`` and ``team_a`` share every sanitised label value, never a digest; a digest is a valid
    Kubernetes and GCE label value whatever the ids."""
    nasty = "Team.DAG:v2/ÄÖ " + "x" * 200
    for dag, run in (("team.a", LIVE_RUN), ("team_a", LIVE_RUN), (nasty, nasty)):
        run_digest, dag_digest = owner_run_digest(dag, run), owner_dag_digest(dag)
        assert len(run_digest) <= 63 and len(dag_digest) <= 63
        assert check_labels("l", {"k": run_digest, "d": dag_digest}) and check_gce_labels("l", {"k": run_digest})
    assert owner_dag_digest("team.a") != owner_dag_digest("team_a")
    assert owner_run_digest("team.a", LIVE_RUN) != owner_run_digest("team_a", LIVE_RUN)
    assert owner_run_digest("a", "b_c") != owner_run_digest("a_b", "c")  # the fields stay apart
    identity = TaskIdentity(nasty, nasty, nasty, 2)
    assert check_labels("labels", kubernetes_ownership_labels(identity))
    assert check_gce_labels("resource_labels", gce_ownership_labels(identity, 1_900_000_000))


# --- local clusters -------------------------------------------------------------------------------------------
def _local_state(base: Path, identity: TaskIdentity, head: int, owner: Any = "record") -> str:
    """A local cluster's state as LocalRayCreateClusterOperator writes it for ``identity`` (its owner record)."""
    name = local_cluster_name(identity)
    (base / name).mkdir(parents=True)
    LocalRayCluster(
        name=name, state_dir=str(base / name), temp_dir=str(base / "tmp"), gcs_address="127.0.0.1:1",
        dashboard_url="http://127.0.0.1:1", serve_port=1, slice=None, started_at=time.time() - 7200,
        nodes=[NodeProcess(role="head", pid=head, log="")], expires_at=time.time() + 3600,
        owner=identity.record() if owner == "record" else owner,
    ).save()  # fmt: skip
    return name


def test_a_running_runs_local_cluster_is_live_whatever_task_started_it(tmp_path: Path) -> None:
    """Started by a task not called start_cluster, or by a mapped task (map index 3): the record's run is running,
    so the cluster is no orphan; the same clusters of a finished run are."""
    started_by = [
        TaskIdentity(DAG, LIVE_RUN, "boot_ray"),
        TaskIdentity(DAG, LIVE_RUN, "start_cluster", map_index=3),
        TaskIdentity(DAG, DONE_RUN, "boot_ray"),
        TaskIdentity(DAG, DONE_RUN, "start_cluster", map_index=3),
    ]
    with live_head(tmp_path / "tmp") as head:
        names = [_local_state(tmp_path, identity, head) for identity in started_by]
        running = {DAG: [LIVE_RUN]}
        for covered in (None, [DAG]):
            found = find_local_orphans(running, older_than=0, now=time.time(), base_dir=tmp_path, covered=covered)
            assert sorted(o.name for o in found) == sorted(names[2:]), [o.line() for o in found]
            assert all(o.reason == f"no running run started it (run {DAG}/{DONE_RUN})" for o in found)


def test_the_create_operator_records_its_task_instance_as_the_owner(tmp_path: Path, monkeypatch: Any) -> None:
    """LocalRayCreateClusterOperator hands start() the task instance's record, the state keeps it, and the
    reaper reads it back: a mapped start task not called start_cluster of a running run owns a live cluster."""
    from tpuflow.local import cluster as cluster_mod
    from tpuflow.local.operators import LocalRayCreateClusterOperator

    asked: list[Any] = []

    def start(cls: type, tpu: Any, name: str, base_dir: Any, **kwargs: Any) -> LocalRayCluster:
        asked.append((name, kwargs.get("owner")))
        raise cluster_mod.LocalClusterError("not starting Ray in this test")

    monkeypatch.setattr(LocalRayCluster, "start", classmethod(start))
    op = LocalRayCreateClusterOperator(
        task_id="boot_ray", tpu_slice={"accelerator": "v6e", "topology": "2x2"}, base_dir=str(tmp_path)
    )
    with pytest.raises(cluster_mod.LocalClusterError):
        op.execute(task_context(dag_id=DAG, run_id=LIVE_RUN, task_id="boot_ray", map_index=3))
    identity = TaskIdentity(DAG, LIVE_RUN, "boot_ray", 3)
    assert asked == [(local_cluster_name(identity), identity.record())]
    monkeypatch.undo()
    with live_head(tmp_path / "tmp") as head:
        name = _local_state(tmp_path, identity, head, owner=asked[0][1])
        assert LocalRayCluster.load(tmp_path / name).owner == identity.record()
        assert find_local_orphans({DAG: [LIVE_RUN]}, older_than=0, now=time.time(), base_dir=tmp_path) == []
        [orphan] = find_local_orphans({DAG: ["manual__later"]}, older_than=0, now=time.time(), base_dir=tmp_path)
        assert orphan.name == name


def test_a_reaper_limited_to_dag_ids_never_judges_another_dag_by_a_shared_name_prefix(tmp_path: Path) -> None:
    """Two DAG ids whose local cluster names share their readable part (cut at 48 characters): a reaper covering
    ..._nightly_a leaves ..._nightly_b's clusters, of its running run and of its finished one."""
    dag_a, dag_b = "tpu_llm_pipeline_local_nightly_a", "tpu_llm_pipeline_local_nightly_b"
    assert (
        local_cluster_name(TaskIdentity(dag_a, LIVE_RUN, "s")).rsplit("-", 1)[0]
        == (local_cluster_name(TaskIdentity(dag_b, LIVE_RUN, "s")).rsplit("-", 1)[0])
    )
    with live_head(tmp_path / "tmp") as head:
        theirs = [
            _local_state(tmp_path, TaskIdentity(dag_b, run, "start_cluster"), head) for run in (LIVE_RUN, DONE_RUN)
        ]
        ours = _local_state(tmp_path, TaskIdentity(dag_a, DONE_RUN, "start_cluster"), head)
        # what the reaper task covering dag_a knows: dag_a's runs only (dag_b's live run is not in it)
        found = find_local_orphans({dag_a: []}, older_than=0, now=time.time(), base_dir=tmp_path, covered=[dag_a])
        assert [o.name for o in found] == [ours]
        assert all(name not in {o.name for o in found} for name in theirs)


def test_a_local_cluster_whose_owner_cannot_be_read_is_reported_never_deleted(tmp_path: Path) -> None:
    """No owner record (a run's name, written before the record existed) or a malformed one: not deleted, whether
    its processes live or not, reported as unreadable; a ``tpuflow local up`` cluster is not a run's at all."""
    identity = TaskIdentity(DAG, DONE_RUN, "start_cluster")
    no_record = dead_local_cluster(tmp_path / "clusters", local_cluster_name(identity), owner={})
    (no_record / "state.json").write_text(
        json.dumps({k: v for k, v in json.loads((no_record / "state.json").read_text()).items() if k != "owner"})
    )
    malformed = TaskIdentity(DAG, DONE_RUN, "other_start")
    with live_head(tmp_path / "tmp") as head:
        bad_name = _local_state(tmp_path / "clusters", malformed, head, owner={"dag_id": DAG, "run_id": 5})
        _local_state(tmp_path / "clusters", TaskIdentity("x", "y", "z"), head, owner=None)  # named as a run's
        up = tmp_path / "clusters" / "tpuflow-v6e-2x2"  # `tpuflow local up`
        up.mkdir()
        LocalRayCluster(name=up.name, state_dir=str(up), temp_dir=str(tmp_path / "tmp"), gcs_address="",
                        dashboard_url="", serve_port=1, slice=None, started_at=1.0,
                        nodes=[NodeProcess(role="head", pid=head, log="")]).save()  # fmt: skip
        scope = ReaperScope(kube=False, leases=False, local_base_dir=str(tmp_path / "clusters"))
        orphans = collect_orphans(scope, FixedRunStates({}), older_than=0)
        assert orphans == []
        assert sorted(o.name for o in orphans.unreadable) == sorted(
            [no_record.name, bad_name, local_cluster_name(TaskIdentity("x", "y", "z"))]
        )
        reasons = {o.name: o.reason for o in orphans.unreadable}
        assert reasons[no_record.name].startswith("owner unreadable: its state.json has no owner record")
        assert reasons[bad_name].startswith("owner unreadable: its state.json's owner is malformed")
        said: list[str] = []
        outcome = reap(orphans, dry_run=False, say=said.append)
        assert outcome["deleted"] == [] and outcome["unreadable"] == [o.line() for o in orphans.unreadable]
        assert said[0].startswith("left 3 resource(s) tpuflow made whose owner cannot be read"), said
        assert said[1:] == [*(f"owner unreadable {o.line()}" for o in orphans.unreadable), "no orphans found"]
        assert (no_record / "state.json").exists() and (tmp_path / "clusters" / bad_name / "state.json").exists()
    assert local_orphan_reason("tpuflow-v6e-2x2", True, {}, None, None, None) is None
    assert isinstance(local_orphan_reason(bad_name, False, {}, owner="nonsense"), OwnerUnreadable)


# --- RayClusters and RayServices ------------------------------------------------------------------------------
def _ray_object(task_id: str, run_id: str, map_index: int = -1) -> dict[str, Any]:
    """A RayCluster as KubeRayCreateClusterOperator applies it (labels and owner annotation) for that task
    instance of DAG."""
    op = KubeRayCreateClusterOperator(task_id=task_id, tpu_slice=TpuSlice.from_spec("v6e", "4x4"),
                                      image="rayproject/ray:2.60.0-py311", kubernetes_conn_id="kube_standin")  # fmt: skip
    context = task_context(dag_id=DAG, run_id=run_id, task_id=task_id, map_index=map_index)
    return op.owned_body(context, "default")


class _Listing:
    """A Kubernetes client listing ``objects`` (RayClusters) as the reaper asks for them."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects
        self.custom_object_client = self

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                      label_selector: str) -> dict[str, Any]:  # fmt: skip
        assert label_selector == "app.kubernetes.io/managed-by=tpuflow"
        return {"items": self.objects if plural == "rayclusters" else []}


@pytest.mark.parametrize(
    ("task_id", "map_index"),
    [("create_ray_cluster", 3), ("_prep_cluster", -1), (GROUPED_TASK, -1), (GROUPED_TASK, 7)],
    ids=["mapped", "leading-underscore", "taskgroup-90-chars", "taskgroup-mapped"],
)
def test_a_ray_object_is_judged_by_its_recorded_run(task_id: str, map_index: int) -> None:
    """A mapped create task, a task id label sanitising changes, one over 63 characters: a running run's object
    is live, a finished run's an orphan, for a reaper covering every DAG or only this one."""
    live, done = _ray_object(task_id, LIVE_RUN, map_index), _ray_object(task_id, DONE_RUN, map_index)
    assert json.loads(live["metadata"]["annotations"][OWNER_ANNOTATION])["task_id"] == task_id
    for covered in (None, [DAG]):
        found = find_kube_orphans(_Listing([live, done]), "default", {DAG: [LIVE_RUN]}, 0, time.time(), covered)
        assert [o.name for o in found] == [done["metadata"]["name"]], [o.line() for o in found]
        assert found[0].reason == f"no running run of DAG {DAG} made it (run {DONE_RUN}, task {task_id})"
    # a reaper covering another DAG: neither is its to judge
    assert find_kube_orphans(_Listing([live, done]), "default", {}, 0, time.time(), ["other_dag"]) == []
    # without the annotation (an object labelled by `tpuflow render`): the owner-run digest label decides
    labels = [obj["metadata"]["labels"] for obj in (live, done)]
    assert kube_orphan_reason(labels[0], {DAG: [LIVE_RUN]}, [DAG]) is None
    assert "no running run of DAG" in kube_orphan_reason(labels[1], {DAG: [LIVE_RUN]}, [DAG])
    assert kube_orphan_reason(labels[1], {DAG: [LIVE_RUN]}, ["other_dag"]) is None


def test_a_ray_object_whose_owner_cannot_be_read_is_reported_never_deleted(tmp_path: Path, monkeypatch: Any) -> None:
    """Through the KubeRay stand-in: a tpuflow RayCluster with only the old run-key labels, one with a malformed
    owner annotation, one whose annotation and owner-run label disagree: reported unreadable, never deleted,
    however finished their run; the finished run's cluster with a readable owner is deleted."""
    kube = KubeRayStandin(tmp_path / "kube", launcher=FakeRayLauncher(), interval=0.05)
    with kube:
        for key, value in kube.connection_env("kube_standin").items():
            monkeypatch.setenv(key, value)

        def create(name: str, labels: dict[str, str], annotations: dict[str, str]) -> None:
            body = _ray_object("create_ray_cluster", DONE_RUN)
            body["metadata"].update(name=name, labels=labels, annotations=annotations)
            kube.store.create(RAYCLUSTERS, "default", body, admit=False)

        done = _ray_object("create_ray_cluster", DONE_RUN)["metadata"]
        legacy = {k: v for k, v in done["labels"].items() if "owner" not in k}
        other = kubernetes_ownership_annotations(TaskIdentity(DAG, LIVE_RUN, "create_ray_cluster"))
        create("finished", done["labels"], done["annotations"])
        create("legacy", legacy, {})
        create("malformed", done["labels"], {OWNER_ANNOTATION: '{"dag_id": "x"}'})
        create("disagree", done["labels"], other)
        scope = ReaperScope(kubernetes_conn_id="kube_standin", namespace="default", local=False, leases=False)
        orphans = collect_orphans(scope, FixedRunStates({DAG: [LIVE_RUN]}), older_than=0)
        assert [o.name for o in orphans] == ["finished"]
        assert sorted(o.name for o in orphans.unreadable) == ["disagree", "legacy", "malformed"]
        outcome = reap(orphans, dry_run=False, say=lambda line: None)
        assert len(outcome["deleted"]) == 1 and len(outcome["unreadable"]) == 3
        deadline = time.time() + 30
        while time.time() < deadline and len(kube.store.list(RAYCLUSTERS)) > 3:
            time.sleep(0.1)
        assert sorted(c["metadata"]["name"] for c in kube.store.list(RAYCLUSTERS)) == [
            "disagree",
            "legacy",
            "malformed",
        ]


# --- node pools and workload policies -------------------------------------------------------------------------
def _pool_labels(dag: str, run: str) -> dict[str, str]:
    return gce_ownership_labels(TaskIdentity(dag, run, "create_node_pool"), int(time.time() + 3600))


def test_node_pools_of_dags_sharing_a_label_value_are_judged_by_their_exact_run(gke: Any) -> None:
    """team.a and team_a write the same tpuflow-dag and tpuflow-run values: team.a's pool of its running run
    stays, team_a's pool of the same run id (finished there) goes, whichever DAG is listed first."""
    run = "scheduled__2026-12-03T00:00:00+00:00"
    assert _pool_labels("team.a", run)[GCE_DAG_LABEL] == _pool_labels("team_a", run)[GCE_DAG_LABEL]
    assert _pool_labels("team.a", run)[GCE_RUN_LABEL] == _pool_labels("team_a", run)[GCE_RUN_LABEL]
    gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("team-dot-a", _pool_labels("team.a", run)))
    gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("team-underscore-a", _pool_labels("team_a", run)))
    scope = ReaperScope(gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE, cluster_name=CLUSTER, kube=False,
                        local=False, leases=False)  # fmt: skip
    for running in ({"team.a": [run], "team_a": ["manual__other"]}, {"team_a": ["manual__other"], "team.a": [run]}):
        for covered in (None, ["team.a", "team_a"], ["team_a"]):
            found = collect_orphans(scope, FixedRunStates(running, covered), older_than=0)
            assert [o.name for o in found] == ["team-underscore-a"], (running, covered, [o.line() for o in found])
        # a reaper covering team.a alone never judges team_a's pool by team.a's runs
        assert collect_orphans(scope, FixedRunStates(running, ["team.a"]), older_than=0) == []
    reap(collect_orphans(scope, FixedRunStates({"team.a": [run]}), older_than=0), dry_run=False, say=lambda s: None)
    assert [p["name"] for p in gke.node_pools()] == ["team-dot-a"]


def test_a_pool_or_policy_whose_owner_cannot_be_read_is_reported_never_deleted() -> None:
    from tpuflow.cost.reaper import find_pool_orphans
    from tpuflow.gke.workload_policy import plan_workload_policy

    labels = _pool_labels("team_a", DONE_RUN)
    legacy = {k: v for k, v in labels.items() if "owner" not in k}  # written before the digests existed
    assert "has no running run" in pool_orphan_reason(labels, {}, time.time())
    for bad in (legacy, {**labels, "tpuflow-owner-run": "not-a-digest"}, {GCE_MANAGED_LABEL: "true"}):
        reason = pool_orphan_reason(bad, {}, time.time())
        assert isinstance(reason, OwnerUnreadable) and reason.startswith("owner unreadable: no valid"), reason

    class Hook:
        location = ZONE

    unreadable: list[Any] = []
    pools = [
        {"name": "legacy", "config": {"resourceLabels": legacy}},
        {"name": "done", "config": {"resourceLabels": labels}},
    ]
    found = find_pool_orphans(Hook(), PROJECT, CLUSTER, pools, [], {}, 0, time.time(), unreadable=unreadable)
    assert [o.name for o in found] == ["done"] and [o.name for o in unreadable] == ["legacy"]

    identity = TaskIdentity("team_a", DONE_RUN, "create_node_pool")
    plan = plan_workload_policy(project_id=PROJECT, zone=ZONE, generation="tpu7x", topology="2x2x2",
                                identity=identity, resource_labels=labels)  # fmt: skip
    assert f"tpuflow-owner-run={identity.run_digest}" in plan.description
    assert "no node pool uses it" in policy_orphan_reason(plan.description, [], set(), {"team.a": [DONE_RUN]})
    assert policy_orphan_reason(plan.description, [], set(), {"team_a": [DONE_RUN]}) is None
    assert policy_orphan_reason(plan.description, [], set(), {}, ["team.a"]) is None  # not covered
    old = plan_workload_policy(project_id=PROJECT, zone=ZONE, generation="tpu7x", topology="2x2x2",
                               identity=identity, resource_labels=legacy)  # fmt: skip
    assert isinstance(policy_orphan_reason(old.description, [], set(), {}), OwnerUnreadable)
