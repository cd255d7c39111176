"""The orphan reaper on the stand-ins: orphans made on purpose are all removed by one reaper run,
unlabelled and still-owned resources are untouched, and a failed list deletes nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cost_support import dead_local_cluster, live_head, pool_body
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE

from tpuflow.cost.reaper import (
    FixedRunStates,
    MetadataDbRunStates,
    ReaperListError,
    ReaperScope,
    TaskSdkRunStates,
    collect_orphans,
    find_lease_orphans,
    kube_orphan_reason,
    local_orphan_reason,
    parse_duration,
    policy_orphan_reason,
    pool_orphan_reason,
    reap,
)
from tpuflow.errors import UserInputError
from tpuflow.labels import gce_ownership_labels, kubernetes_ownership_labels
from tpuflow.naming import TaskIdentity
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, KubeRayStandin
from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS

DAG = "tpu_llm_pipeline_gke"
# a user's own DAG built with the pipeline factory (named after the shipped one): not in the reaper's dag_ids
OTHER_DAG = "tpu_llm_pipeline_gke_mine"
LIVE_RUN, KILLED_RUN = "manual__2026-12-01T10:00:00+00:00", "scheduled__2026-11-30T00:00:00+00:00"


def owned_pool_labels(run_id: str, expires_in: float = 3600, dag: str = DAG) -> dict[str, str]:
    return gce_ownership_labels(TaskIdentity(dag, run_id, "create_node_pool"), int(time.time() + expires_in))


def make_policy(gke: Any, run_id: str | None, name: str) -> None:
    """A HIGH_THROUGHPUT workload policy as the create task makes it for ``run_id`` (None: made by hand)."""
    from tpuflow.gke.workload_policy import plan_workload_policy, region_of

    if run_id is None:
        body = {"name": name, "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}}
    else:
        identity = TaskIdentity(DAG, run_id, "create_node_pool")
        plan = plan_workload_policy(project_id=PROJECT, zone=ZONE, generation="tpu7x", topology="2x2x2",
                                    identity=identity, resource_labels=owned_pool_labels(run_id))  # fmt: skip
        body = {**plan.body(), "name": name}
    gke.compute.insert(PROJECT, region_of(ZONE), body)


def policy_names(gke: Any) -> list[str]:
    return sorted(p["name"] for p in gke.compute.policies())


def raycluster(name: str, labels: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if labels is not None:
        meta["labels"] = labels
    head = {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": "ray"}]}}}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta, "spec": {"headGroupSpec": head}}


def test_parse_duration() -> None:
    assert parse_duration("2h") == 7200 and parse_duration("30m") == 1800 and parse_duration("0s") == 0
    assert parse_duration("1.5d") == 1.5 * 86400
    for bad in ("2", "h", "-1h", "2 hours", ""):
        with pytest.raises(UserInputError) as err:
            parse_duration(bad)
        assert err.value.field == "--older-than"


def test_decisions_follow_the_labels() -> None:
    running = {DAG: [LIVE_RUN]}
    now = time.time()
    assert pool_orphan_reason(owned_pool_labels(LIVE_RUN), running, now, [DAG]) is None
    assert "not running" in pool_orphan_reason(owned_pool_labels(KILLED_RUN), running, now, [DAG])
    assert "tpuflow-expires" in pool_orphan_reason(owned_pool_labels(LIVE_RUN, -10), running, now, [DAG])
    assert pool_orphan_reason({"team": "ml"}, running, now, [DAG]) is None
    live = kubernetes_ownership_labels(TaskIdentity(DAG, LIVE_RUN, "create_ray_cluster"))
    killed = kubernetes_ownership_labels(TaskIdentity(DAG, KILLED_RUN, "create_ray_cluster"))
    assert kube_orphan_reason(live, running) is None
    assert "no running run" in kube_orphan_reason(killed, running)
    assert kube_orphan_reason({"app": "x"}, running) is None
    from tpuflow.gke.workload_policy import plan_workload_policy

    def described(run_id: str) -> str:
        identity = TaskIdentity(DAG, run_id, "create_node_pool")
        plan = plan_workload_policy(project_id=PROJECT, zone=ZONE, generation="tpu7x", topology="2x2x2",
                                    identity=identity, resource_labels=owned_pool_labels(run_id))  # fmt: skip
        return plan.description

    assert policy_orphan_reason(described(LIVE_RUN), [], set(), running) is None  # its pool is coming
    assert "no node pool uses it" in policy_orphan_reason(described(KILLED_RUN), [], set(), running)
    assert policy_orphan_reason(described(KILLED_RUN), ["p1"], set(), running) is None  # a live pool uses it
    assert "deleted after them" in policy_orphan_reason(described(KILLED_RUN), ["p1"], {"p1"}, running)
    assert policy_orphan_reason("made by hand", [], set(), running) is None


def test_a_dag_the_run_states_do_not_cover_keeps_its_resources(tmp_path: Path) -> None:
    """The reaper task asks only about its dag_ids: another DAG's resource is not known to be unowned, so
    its run state never makes it an orphan (its expiry still does); a covered DAG's with no running run is."""
    from tpuflow.gke.workload_policy import plan_workload_policy
    from tpuflow.local.operators import local_cluster_name
    from tpuflow.slices.leases import LocalLeaseStore

    covered, running, now = [DAG], {DAG: [LIVE_RUN]}, time.time()

    def description(dag: str) -> str:
        identity, labels = TaskIdentity(dag, KILLED_RUN, "create_node_pool"), owned_pool_labels(KILLED_RUN, dag=dag)
        plan = plan_workload_policy(project_id=PROJECT, zone=ZONE, generation="tpu7x", topology="2x2x2",
                                    identity=identity, resource_labels=labels)  # fmt: skip
        return plan.description

    def ray_labels(dag: str) -> dict[str, str]:
        return kubernetes_ownership_labels(TaskIdentity(dag, KILLED_RUN, "create_ray_cluster"))

    def local_name(dag: str) -> str:
        return local_cluster_name(TaskIdentity(dag, KILLED_RUN, "start_cluster"))

    def local_owner(dag: str) -> dict[str, Any]:
        return TaskIdentity(dag, KILLED_RUN, "start_cluster").record()

    # another DAG's: kept, whatever running() says
    assert pool_orphan_reason(owned_pool_labels(KILLED_RUN, dag=OTHER_DAG), running, now, covered) is None
    assert kube_orphan_reason(ray_labels(OTHER_DAG), running, covered) is None
    assert policy_orphan_reason(description(OTHER_DAG), [], set(), running, covered) is None
    assert local_orphan_reason(local_name(OTHER_DAG), True, running, covered, owner=local_owner(OTHER_DAG)) is None
    # ... unless past its expiry, or its processes are gone: neither is its run state
    expired = owned_pool_labels(KILLED_RUN, -10, dag=OTHER_DAG)
    assert "tpuflow-expires" in pool_orphan_reason(expired, running, now, covered)
    assert "processes are gone" in local_orphan_reason(
        local_name(OTHER_DAG), False, running, covered, owner=local_owner(OTHER_DAG)
    )
    # the same resources of a covered DAG whose run is not running: orphans
    assert "not running" in pool_orphan_reason(owned_pool_labels(KILLED_RUN), running, now, covered)
    assert "has no running run" in pool_orphan_reason(owned_pool_labels(KILLED_RUN), {}, now, covered)
    assert "no running run" in kube_orphan_reason(ray_labels(DAG), running, covered)
    assert "no node pool uses it" in policy_orphan_reason(description(DAG), [], set(), running, covered)
    assert "no running run" in local_orphan_reason(local_name(DAG), True, running, covered, owner=local_owner(DAG))
    # run states that cover every DAG (the metadata DB: None) judge the other DAG's too
    assert "has no running run" in pool_orphan_reason(owned_pool_labels(KILLED_RUN, dag=OTHER_DAG), running, now)
    assert "no running run" in kube_orphan_reason(ray_labels(OTHER_DAG), running)
    assert "no node pool uses it" in policy_orphan_reason(description(OTHER_DAG), [], set(), running)
    assert "no running run" in local_orphan_reason(local_name(OTHER_DAG), True, running, owner=local_owner(OTHER_DAG))
    # leases: only a covered DAG's run's is given back
    leases = LocalLeaseStore(tmp_path / "leases")
    for dag in (DAG, OTHER_DAG):
        assert leases.try_acquire(f"{dag}/{KILLED_RUN}", 16) is not None
    assert [o.reason for o in find_lease_orphans(leases, running, covered=covered)] == [
        f"held by {DAG}/{KILLED_RUN}, which is not running"
    ]
    assert len(find_lease_orphans(leases, running)) == 2
    # what says which DAGs are covered: the reaper task its dag_ids, the CLI's metadata DB every DAG
    from support.airflow_context import FakeTaskInstance

    assert TaskSdkRunStates(FakeTaskInstance(), covered).dag_ids == covered
    assert MetadataDbRunStates().dag_ids is None and FixedRunStates({}).dag_ids is None
    assert FixedRunStates({}, covered).dag_ids == covered


def test_past_its_expiry_a_ray_object_or_local_cluster_is_an_orphan_whatever_its_run_state() -> None:
    """As a node pool: past its tpuflow-expires (label, or a local cluster's recorded expires_at) it is an orphan
    even while its run is running, and for a DAG the run states do not cover; before it, a running run's is
    kept; a resource without the ownership labels never is, expired or not."""
    from tpuflow.labels import EXPIRES_LABEL
    from tpuflow.local.operators import local_cluster_name

    running, now = {DAG: [LIVE_RUN]}, time.time()
    past, future = int(now - 10), int(now + 3600)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(past))

    def ray_labels(dag: str, run: str, task: str, expires_at: int | None) -> dict[str, str]:
        return kubernetes_ownership_labels(TaskIdentity(dag, run, task), expires_at)

    # a RayCluster's and a RayService's labels differ only by the task that made them
    for task in ("create_ray_cluster", "deploy_rayservice"):
        for covered in ([DAG], None):
            assert kube_orphan_reason(ray_labels(DAG, LIVE_RUN, task, future), running, covered, now) is None
            expired = kube_orphan_reason(ray_labels(DAG, LIVE_RUN, task, past), running, covered, now)
            assert expired == f"past its tpuflow-expires label ({stamp} UTC)"
        # the same words as a node pool's
        pool_labels = gce_ownership_labels(TaskIdentity(DAG, LIVE_RUN, "create_node_pool"), past)
        pool = pool_orphan_reason(pool_labels, running, now, [DAG])
        assert pool == kube_orphan_reason(ray_labels(DAG, LIVE_RUN, task, past), running, [DAG], now)
        # another DAG's: its run state says nothing (not covered), its expiry still does
        assert kube_orphan_reason(ray_labels(OTHER_DAG, KILLED_RUN, task, future), running, [DAG], now) is None
        assert "tpuflow-expires" in kube_orphan_reason(
            ray_labels(OTHER_DAG, KILLED_RUN, task, past), running, [DAG], now
        )
        # no expiry label (made before it existed, or expires_after=None): the run state alone
        assert kube_orphan_reason(ray_labels(DAG, LIVE_RUN, task, None), running, [DAG], now) is None
    # not ours: never, whatever its expiry label says
    assert kube_orphan_reason({EXPIRES_LABEL: str(past)}, running, None, now) is None
    assert kube_orphan_reason({"app.kubernetes.io/managed-by": "someone", EXPIRES_LABEL: "1"}, {}, None, now) is None

    live_owner = TaskIdentity(DAG, LIVE_RUN, "start_cluster")
    theirs_owner = TaskIdentity(OTHER_DAG, KILLED_RUN, "start_cluster")
    live, theirs = local_cluster_name(live_owner), local_cluster_name(theirs_owner)
    assert local_orphan_reason(live, True, running, [DAG], future, now, owner=live_owner.record()) is None
    assert local_orphan_reason(live, True, running, [DAG], None, now, owner=live_owner.record()) is None
    assert (
        local_orphan_reason(live, True, running, [DAG], past, now, owner=live_owner.record())
        == f"past its tpuflow-expires time ({stamp} UTC)"
    )
    assert local_orphan_reason(theirs, True, running, [DAG], future, now, owner=theirs_owner.record()) is None
    assert "tpuflow-expires" in local_orphan_reason(
        theirs, True, running, [DAG], past, now, owner=theirs_owner.record()
    )
    # started by `tpuflow local up` (no run's name): never
    assert local_orphan_reason("tpuflow-v6e-2x2", True, {}, None, past, now) is None


def test_the_finders_read_the_expiry_of_ray_objects_and_local_clusters(tmp_path: Path) -> None:
    """find_kube_orphans reads the label off the listed objects, find_local_orphans the expires_at the state
    file records; both for a running run's resources."""
    from tpuflow.cost.reaper import find_kube_orphans, find_local_orphans
    from tpuflow.kuberay import RAYCLUSTERS as CLUSTERS
    from tpuflow.kuberay import RAYSERVICES
    from tpuflow.local.cluster import LocalRayCluster, NodeProcess
    from tpuflow.local.operators import local_cluster_name

    other_live_run = "manual__2026-12-01T11:00:00+00:00"
    running, now = {DAG: [LIVE_RUN, other_live_run]}, time.time()

    def listed(task: str, expires_in: float, **extra: str) -> dict[str, Any]:
        labels = kubernetes_ownership_labels(TaskIdentity(DAG, LIVE_RUN, task), int(now + expires_in))
        return {"metadata": {"name": f"{task}-{expires_in:+.0f}".replace("_", "-"), "labels": {**labels, **extra}}}

    objects = {
        RAYSERVICES: [listed("deploy_rayservice", -60), listed("deploy_rayservice", 3600)],
        CLUSTERS: [listed("create_ray_cluster", -60), listed("create_ray_cluster", 3600)],
    }

    class Objects:
        def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                          label_selector: str) -> dict[str, Any]:  # fmt: skip
            assert label_selector == "app.kubernetes.io/managed-by=tpuflow"
            return {"items": objects[plural]}

    class Hook:
        custom_object_client = Objects()

    found = find_kube_orphans(Hook(), "default", running, older_than=0, now=now)
    assert [(o.kind, o.name) for o in found] == [
        ("rayservice", "deploy-rayservice--60"),
        ("raycluster", "create-ray-cluster--60"),
    ]
    assert all(o.reason.startswith("past its tpuflow-expires label (") for o in found)

    # a running run's local cluster, alive (its head: a process naming its temp dir), past what its state records
    with live_head(tmp_path / "tmp") as head:
        for run, expires_in in ((LIVE_RUN, -60), (other_live_run, 3600)):
            identity = TaskIdentity(DAG, run, "start_cluster")
            name = local_cluster_name(identity)
            (tmp_path / name).mkdir()
            LocalRayCluster(
                name=name, state_dir=str(tmp_path / name), temp_dir=str(tmp_path / "tmp"), gcs_address="127.0.0.1:1",
                dashboard_url="http://127.0.0.1:1", serve_port=1, slice=None, started_at=now - 7200,
                nodes=[NodeProcess(role="head", pid=head, log="")], expires_at=now + expires_in,
                owner=identity.record(),
            ).save()  # fmt: skip
        [orphan] = find_local_orphans(running, older_than=0, now=now, base_dir=tmp_path)
    assert orphan.name == local_cluster_name(TaskIdentity(DAG, LIVE_RUN, "start_cluster"))
    assert orphan.reason.startswith("past its tpuflow-expires time (")


def test_a_kept_resource_is_never_an_orphan_whatever_its_run_and_expiry() -> None:
    """The kept mark (a keep_endpoint teardown's tpuflow-kept=true) spares a node pool, a RayService or
    RayCluster, and so the workload policy of a kept pool, however finished its run or past its expiry, for
    run states that cover its DAG or not; another value of the label, or a resource not ours, is no mark."""
    from tpuflow.gke.workload_policy import plan_workload_policy
    from tpuflow.labels import KEPT_LABEL, is_kept, kept_labels, kept_metadata_patch

    running, now = {DAG: [LIVE_RUN]}, time.time()
    expired_pool = owned_pool_labels(KILLED_RUN, -60)
    expired_ray = kubernetes_ownership_labels(TaskIdentity(DAG, KILLED_RUN, "deploy"), int(now - 60))
    assert "tpuflow-expires" in pool_orphan_reason(expired_pool, running, now, [DAG])
    assert "tpuflow-expires" in kube_orphan_reason(expired_ray, running, [DAG], now)
    for covered in ([DAG], None, [OTHER_DAG]):
        # as the teardowns mark them (the expiry removed), and with an expiry label still there
        for pool in (kept_labels(expired_pool), {**expired_pool, KEPT_LABEL: "true"}):
            assert pool_orphan_reason(pool, running, now, covered) is None
            assert pool_orphan_reason(pool, {}, now, covered) is None
        for ray in (kept_labels(expired_ray), {**expired_ray, KEPT_LABEL: "true"}):
            assert kube_orphan_reason(ray, running, covered, now) is None
            assert kube_orphan_reason(ray, {}, covered, now) is None
    assert "tpuflow-expires" not in kept_labels(expired_pool) and is_kept(kept_labels(expired_pool))
    assert kept_metadata_patch() == {"metadata": {"labels": {KEPT_LABEL: "true", "tpuflow-expires": None}}}
    # only "true" marks it
    assert "tpuflow-expires" in pool_orphan_reason({**expired_pool, KEPT_LABEL: "false"}, running, now, [DAG])
    assert "tpuflow-expires" in kube_orphan_reason({**expired_ray, KEPT_LABEL: "yes"}, running, [DAG], now)
    # the mark does not make someone else's resource ours
    assert pool_orphan_reason({KEPT_LABEL: "true"}, {}, now) is None
    assert kube_orphan_reason({KEPT_LABEL: "true"}, {}, None, now) is None
    # a workload policy whose pool is kept: the pool is no orphan, so the policy stays with it
    identity = TaskIdentity(DAG, KILLED_RUN, "create_serve_node_pool")
    plan = plan_workload_policy(project_id=PROJECT, zone=ZONE, generation="tpu7x", topology="2x2x2",
                                identity=identity, resource_labels=expired_pool)  # fmt: skip
    assert policy_orphan_reason(plan.description, ["kept-pool"], set(), {}) is None
    assert "deleted after them" in policy_orphan_reason(plan.description, ["kept-pool"], {"kept-pool"}, {})


def test_the_finders_count_kept_resources_and_a_reaper_run_says_so() -> None:
    """The finders hand what the mark spared to ``kept`` (a RayService's own RayCluster is judged with it, never
    alone); collect_orphans' answer carries them, and reap (dry or not) says how many it skipped and never
    deletes them."""
    from tpuflow.cost.reaper import Orphan, Orphans, find_kube_orphans, find_pool_orphans
    from tpuflow.kuberay import RAYCLUSTERS as CLUSTERS
    from tpuflow.kuberay import RAYSERVICES
    from tpuflow.labels import kept_labels

    now = time.time()

    def listed(name: str, task: str, kept: bool, **meta: Any) -> dict[str, Any]:
        labels = kubernetes_ownership_labels(TaskIdentity(DAG, KILLED_RUN, task), int(now + 3600))
        return {"metadata": {"name": name, "labels": kept_labels(labels) if kept else labels, **meta}}

    owned_by_service = {"ownerReferences": [{"kind": "RayService", "name": "kept-svc"}]}
    objects = {
        RAYSERVICES: [listed("kept-svc", "deploy", True), listed("left-svc", "deploy", False)],
        CLUSTERS: [listed("kept-svc-raycluster-x", "deploy", False, **owned_by_service),
                   listed("left-cluster", "create_ray_cluster", False)],
    }  # fmt: skip

    class Objects:
        def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                          label_selector: str) -> dict[str, Any]:  # fmt: skip
            return {"items": objects[plural]}

    class Hook:
        custom_object_client = Objects()
        location = ZONE

    kept: list[Orphan] = []
    found = find_kube_orphans(Hook(), "default", {}, older_than=0, now=now, kept=kept)
    assert [(o.kind, o.name) for o in found] == [("rayservice", "left-svc"), ("raycluster", "left-cluster")]
    assert [(k.kind, k.name, k.where) for k in kept] == [("rayservice", "kept-svc", "namespace default")]

    pools = [
        {"name": "serve", "config": {"resourceLabels": kept_labels(owned_pool_labels(KILLED_RUN, -60))}},
        {"name": "train", "config": {"resourceLabels": owned_pool_labels(KILLED_RUN)}},
        {"name": "theirs", "config": {"resourceLabels": {"tpuflow-kept": "true"}}},  # not ours: not counted
    ]
    orphans = find_pool_orphans(Hook(), PROJECT, CLUSTER, pools, [], {}, 0, now, kept=kept)
    assert [o.name for o in orphans] == ["train"]
    assert [k.name for k in kept] == ["kept-svc", "serve"]
    assert kept[1].line() == (
        f"node_pool serve (projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}): kept by its run's keep_endpoint "
        "(tpuflow-kept): still running, and billed"
    )

    deleted: list[str] = []
    answer = Orphans([Orphan("raycluster", "left-cluster", "namespace default", "gone", lambda: deleted.append("x"))],
                     kept)  # fmt: skip
    assert answer == [answer[0]] and answer.kept == kept  # still the list of orphans callers compare
    for dry_run in (True, False):
        said: list[str] = []
        outcome = reap(answer, dry_run=dry_run, say=said.append)
        assert said[0].startswith("skipped 2 kept endpoint resource(s) (keep_endpoint): still running, and billed")
        assert said[1:3] == [f"kept {k.line()}" for k in kept]
        assert outcome["kept"] == [k.line() for k in kept] and len(outcome["found"]) == 1
    assert deleted == ["x"]  # the orphan, once; the kept never
    said = []
    assert reap([], dry_run=True, say=said.append)["kept"] == [] and said == ["no orphans found"]


def test_the_reaper_task_counts_only_runs_still_running() -> None:
    """Inside a task (no metadata DB): a run with unfinished tasks is running unless its run is over."""
    from support.airflow_context import FakeTaskInstance

    unfinished = {"create_node_pool": "success", "train": "deferred"}
    ti = FakeTaskInstance(
        task_states={DAG: {"live": unfinished, "done": {"train": "success"}, "failed": unfinished, "gone": unfinished}},
        run_states={f"{DAG}/failed": "failed", f"{DAG}/gone": None},  # "gone": deleted from the metadata DB
    )
    assert TaskSdkRunStates(ti, [DAG]).running() == {DAG: ["live"]}


def test_one_reaper_run_removes_every_orphan_and_nothing_else(gke: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from tpuflow.slices.leases import LocalLeaseStore

    kube = KubeRayStandin(tmp_path / "kube", launcher=FakeRayLauncher(), interval=0.05)
    with kube:
        for key, value in kube.connection_env("kube_standin").items():
            monkeypatch.setenv(key, value)
        # GKE: a pool whose create task was killed mid-create (still PROVISIONING), one past its expiry,
        # one of the live run, and one without labels
        gke.operation_seconds = 0.3
        gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("expired", owned_pool_labels(LIVE_RUN, -60)))
        gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("live", owned_pool_labels(LIVE_RUN)))
        gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("unlabelled", None))
        # Compute: the workload policy of the killed run's tpu7x pool (the pool is gone), the live run's (made
        # before its pool), and one made by hand
        for name, run in (("wp-killed", KILLED_RUN), ("wp-live", LIVE_RUN), ("wp-by-hand", None)):
            make_policy(gke, run, name)
        # an insert is an operation: the policies exist once it is done (on an idle machine the dry run below
        # came before that, and missed wp-killed)
        deadline = time.time() + 30
        while time.time() < deadline and len(policy_names(gke)) < 3:
            time.sleep(0.05)
        assert policy_names(gke) == ["wp-by-hand", "wp-killed", "wp-live"]
        # Kubernetes: a RayCluster left by the killed run, one of the live run, one without labels
        store = kube.store
        for name, identity in (("killed-run", KILLED_RUN), ("live-run", LIVE_RUN)):
            labels = kubernetes_ownership_labels(TaskIdentity(DAG, identity, "create_ray_cluster"))
            store.create(RAYCLUSTERS, "default", raycluster(name, labels), admit=False)
        store.create(RAYCLUSTERS, "default", raycluster("someone-elses", None), admit=False)
        # local: a cluster whose run was killed, its processes gone; a lease the killed run still holds
        local_dir = dead_local_cluster(tmp_path / "clusters", "local-tpu-llm-pipeline-local-0123456789")
        leases = LocalLeaseStore(tmp_path / "leases")
        assert leases.try_acquire(f"tpu_llm_pipeline_local/{KILLED_RUN}", 1) is not None

        scope = ReaperScope(
            gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE, cluster_name=CLUSTER,
            kubernetes_conn_id="kube_standin", local_base_dir=str(tmp_path / "clusters"),
            lease_root=str(tmp_path / "leases"),
        )  # fmt: skip
        states = FixedRunStates({DAG: [LIVE_RUN]})
        # the first API client of the process takes seconds to build on a busy machine: not part of the create
        collect_orphans(scope, states, older_than=86400)
        gke.operation_seconds = 10.0
        gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("killed-mid-create", owned_pool_labels(KILLED_RUN)))
        gke.operation_seconds = 0.3
        # a dry run lists them, with why, and deletes nothing
        said: list[str] = []
        dry = reap(collect_orphans(scope, states, older_than=0), dry_run=True, say=said.append)
        assert dry["deleted"] == [] and len(dry["found"]) == 6, said
        assert any(line.startswith("would delete workload_policy wp-killed") for line in said), said
        assert any("killed-mid-create" in line and "PROVISIONING" in line for line in said), said
        assert {p["name"]: p["status"] for p in gke.node_pools()}["killed-mid-create"] == "PROVISIONING"
        assert any("expired" in line and "tpuflow-expires" in line for line in said), said
        assert len(gke.node_pools()) == 4

        outcome = reap(collect_orphans(scope, states, older_than=0), dry_run=False, say=said.append)
        assert outcome["failed"] == [] and len(outcome["deleted"]) == 6, said
        assert sorted(p["name"] for p in gke.node_pools()) == ["live", "unlabelled"]
        assert policy_names(gke) == ["wp-by-hand", "wp-live"]
        deadline = time.time() + 30
        while time.time() < deadline and len(store.list(RAYCLUSTERS)) > 2:
            time.sleep(0.1)
        assert sorted(c["metadata"]["name"] for c in store.list(RAYCLUSTERS)) == ["live-run", "someone-elses"]
        assert not (local_dir / "state.json").exists()
        # the killed run's lease no longer blocks the next run
        assert leases.try_acquire(f"{DAG}/{LIVE_RUN}", 1) is not None
        # a second run finds nothing left
        assert collect_orphans(scope, states, older_than=0) == []


def test_a_failed_list_deletes_nothing(gke: Any, tmp_path: Path) -> None:
    local_dir = dead_local_cluster(tmp_path / "clusters", "local-tpu-llm-pipeline-local-abcdef0123")
    gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("orphan", owned_pool_labels(KILLED_RUN)))
    scope = ReaperScope(
        gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE, cluster_name="no-such-cluster", kube=False,
        local_base_dir=str(tmp_path / "clusters"), lease_root=str(tmp_path / "leases"),
    )  # fmt: skip
    with pytest.raises(ReaperListError, match="no-such-cluster"):
        collect_orphans(scope, FixedRunStates({}), older_than=0)
    assert (local_dir / "state.json").exists() and len(gke.node_pools()) == 1


def reaper_task_context() -> dict[str, Any]:
    """The reaper task's context: its Task SDK answers that LIVE_RUN of DAG runs and KILLED_RUN finished."""
    from support.airflow_context import FakeTaskInstance, task_context

    states = {DAG: {LIVE_RUN: {"create_node_pool": "success", "train": "running"}, KILLED_RUN: {"train": "success"}}}
    return task_context(FakeTaskInstance(dag_id="tpuflow_reaper", task_id="reap", task_states=states))


def test_the_reaper_task_deletes_what_its_dags_runs_left_and_nothing_else(
    gke: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """TPUReapOrphansOperator.execute as Airflow runs it: the run states come through the Task SDK for its
    dag_ids only, and a labelled resource of another DAG is left alone (unless past its expiry)."""
    from tpuflow.cost.operators import TPUReapOrphansOperator
    from tpuflow.local.cluster import default_base_dir
    from tpuflow.slices.leases import LocalLeaseStore, default_lease_root

    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))  # the task's local clusters and leases
    monkeypatch.delenv("TPUFLOW_SLICE_LEASES", raising=False)
    kube = KubeRayStandin(tmp_path / "kube", launcher=FakeRayLauncher(), interval=0.05)
    with kube:
        for key, value in kube.connection_env("kube_standin").items():
            monkeypatch.setenv(key, value)
        for name, labels in (
            ("finished", owned_pool_labels(KILLED_RUN)),
            ("live", owned_pool_labels(LIVE_RUN)),
            ("theirs", owned_pool_labels(KILLED_RUN, dag=OTHER_DAG)),
            ("theirs-expired", owned_pool_labels(KILLED_RUN, -60, dag=OTHER_DAG)),
            ("unlabelled", None),
        ):
            gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body(name, labels))
        store = kube.store
        for name, dag in (("finished-run", DAG), ("their-run", OTHER_DAG)):
            labels = kubernetes_ownership_labels(TaskIdentity(dag, KILLED_RUN, "create_ray_cluster"))
            store.create(RAYCLUSTERS, "default", raycluster(name, labels), admit=False)
        leases = LocalLeaseStore(default_lease_root())
        for dag in (DAG, OTHER_DAG):
            assert leases.try_acquire(f"{dag}/{KILLED_RUN}", 16) is not None
        assert not default_base_dir().exists()  # no local cluster: nothing of the machine's own is looked at

        def reaper(dry_run: bool) -> TPUReapOrphansOperator:
            return TPUReapOrphansOperator(
                task_id="reap", dag_ids=[DAG, "tpu_llm_pipeline_local"], older_than="0s", dry_run=dry_run,
                gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE, cluster_name=CLUSTER,
                kubernetes_conn_id="kube_standin", namespace="default",
            )  # fmt: skip

        found = [
            f"node_pool finished (projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER})",
            f"node_pool theirs-expired (projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER})",
            "raycluster finished-run (namespace default)",
            f"lease slot 0 ({leases.describe()})",
        ]
        dry = reaper(dry_run=True).execute(reaper_task_context())
        assert set(dry) == {"dry_run", "found", "deleted", "failed", "kept", "unreadable", "renewed"}
        assert dry["dry_run"] is True and dry["deleted"] == [] and dry["failed"] == []
        assert [line.split(": ", 1)[0] for line in dry["found"]] == found, dry["found"]
        assert len(gke.node_pools()) == 5 and len(store.list(RAYCLUSTERS)) == 2 and len(leases.holders(16)) == 2

        outcome = reaper(dry_run=False).execute(reaper_task_context())
        assert outcome["dry_run"] is False and outcome["failed"] == []
        assert [line.split(": ", 1)[0] for line in outcome["found"]] == found, outcome["found"]
        assert outcome["deleted"] == outcome["found"]
        assert sorted(p["name"] for p in gke.node_pools()) == ["live", "theirs", "unlabelled"]
        deadline = time.time() + 30
        while time.time() < deadline and len(store.list(RAYCLUSTERS)) > 1:
            time.sleep(0.1)
        assert [c["metadata"]["name"] for c in store.list(RAYCLUSTERS)] == ["their-run"]
        assert [lease.holder for lease in leases.holders(16).values()] == [f"{OTHER_DAG}/{KILLED_RUN}"]


def test_the_reaper_task_fails_on_a_failed_list_and_deletes_nothing(gke: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from tpuflow.cost.operators import TPUReapOrphansOperator

    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))
    gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("finished", owned_pool_labels(KILLED_RUN)))
    op = TPUReapOrphansOperator(
        task_id="reap", dag_ids=[DAG], older_than="0s", gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE,
        cluster_name="no-such-cluster", kubernetes_conn_id="kube_standin",
    )  # fmt: skip
    with pytest.raises(AirflowFailException) as err:
        op.execute(reaper_task_context())
    assert str(err.value).startswith("Nothing deleted:") and "no-such-cluster" in str(err.value), err.value
    assert [p["name"] for p in gke.node_pools()] == ["finished"]


def test_older_than_spares_young_resources(gke: Any, tmp_path: Path) -> None:
    gke.create_node_pool(PROJECT, ZONE, CLUSTER, pool_body("young", owned_pool_labels(KILLED_RUN)))
    scope = ReaperScope(
        gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE, cluster_name=CLUSTER, kube=False,
        local_base_dir=str(tmp_path / "clusters"), lease_root=str(tmp_path / "leases"),
    )  # fmt: skip
    assert collect_orphans(scope, FixedRunStates({}), older_than=3600) == []
    assert [o.name for o in collect_orphans(scope, FixedRunStates({}), older_than=0)] == ["young"]


def test_cli_malformed_older_than_is_one_line(capsys: Any) -> None:
    from tpuflow.cli import main

    assert main(["reap", "--older-than", "2 hours"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--older-than" in err[0] and "2h" in err[0]


def test_cli_dry_run_lists_local_orphans(migrated_airflow_db: Path, tmp_path: Path, capsys: Any) -> None:
    local_dir = dead_local_cluster(tmp_path / "clusters", "local-tpu-llm-pipeline-local-feedbeef01")
    from tpuflow.cli import main

    args = ["reap", "--older-than", "1h", "--base-dir", str(tmp_path / "clusters"), "--lease-root", str(tmp_path / "l")]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would delete local_cluster local-tpu-llm-pipeline-local-feedbeef01" in out, out
    assert (local_dir / "state.json").exists()
    assert main(args) == 0
    assert "deleted local_cluster" in capsys.readouterr().out
    assert not (local_dir / "state.json").exists()
