"""`tpu_llm_pipeline_gke` against the GKE API stand-in and the Kubernetes stand-in with simulated KubeRay.

The DAG file is the shipped one (the session's DAGs folder links dags/*.py); it is pointed at the
stand-ins only through Airflow connections and Variables (AIRFLOW_CONN_* / AIRFLOW_VAR_*), and run with
dag.test() (what `airflow dags test` runs: real task runner, XCom, triggers inline). The simulated
KubeRay starts a real local Ray cluster (a head plus one simulated TPU host per GKE node) for the
training RayCluster and another for the RayService, once the GKE stand-in has the matching node pool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.airflow_context import task_context
from support.gke_pipeline import (
    CLUSTER,
    CLUSTER_PATH,
    DAG_ID,
    PROJECT,
    ZONE,
    load_dag,
    point_airflow_at,
    task_states,
    wait_until_empty,
)
from support.pipeline_steps import GKE_TRAIN_TO_REPORT

from tpuflow.cost.ledger import rfc3339_to_unix
from tpuflow.errors import UserInputError
from tpuflow.labels import EXPIRES_LABEL, GCE_OWNER_RUN_LABEL, OWNER_RUN_LABEL
from tpuflow.serve.idle_stop import NOT_KEPT
from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
from tpuflow_rehearsal.standins.kuberay_controller import (
    FakeRayLauncher,
    GkeNodePools,
    KubeRayStandin,
    LaunchSpec,
    LocalRayLauncher,
    RayClusterHandle,
)
from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS, RAYSERVICES

REPO = Path(__file__).resolve().parents[2]
ORDER = [
    "check_params",
    "budget_guard",
    "approve_budget",
    "acquire_slice",
    "create_node_pool",
    "create_ray_cluster",
    *GKE_TRAIN_TO_REPORT,
]
TEARDOWNS = [
    "delete_service",
    "delete_serve_provisioning_request",
    "delete_serve_node_pool",
    "delete_ray_cluster",
    "delete_provisioning_request",
    "delete_node_pool",
    "delete_prep_cluster",
    "chip_ledger",
    "release_slice",
]
# the training slice's teardowns: right after train, not after the report
TRAINING_SLICE_TEARDOWNS = ("delete_ray_cluster", "delete_provisioning_request", "delete_node_pool")


class RecordingLauncher(LocalRayLauncher):
    """LocalRayLauncher that remembers every cluster it started (to check their processes are gone)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clusters: list[Any] = []

    def launch(self, spec: LaunchSpec) -> RayClusterHandle:
        handle = super().launch(spec)
        self.clusters.append(handle.cluster)  # type: ignore[attr-defined]
        return handle


# --- the DAG's shape and its checks (no stand-ins) -------------------------------------------------------
def test_gke_pipeline_shape(migrated_airflow_db: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / f"{DAG_ID}.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag(DAG_ID)
    for up, down in zip(ORDER, ORDER[1:], strict=False):
        if (up, down) == ("evaluate", "build_serve_config"):
            assert "create_serve_node_pool" in dag.get_task(up).downstream_task_ids
        assert down in dag.get_task(up).downstream_task_ids, (up, down)
    assert "deploy" in dag.get_task("create_serve_node_pool").downstream_task_ids
    assert {t.task_id for t in dag.tasks if t.is_setup} == {
        "check_params",
        "acquire_slice",
        "create_prep_cluster",
        "create_node_pool",
        "create_ray_cluster",
        "create_serve_node_pool",
        "request_capacity",
        "request_serve_capacity",
    }
    assert {t.task_id for t in dag.tasks if t.is_teardown} == set(TEARDOWNS)
    for teardown in TEARDOWNS:
        # Every teardown has check_params among its setups: it runs even when its own create task failed.
        assert "check_params" in dag.get_task(teardown).upstream_task_ids
        upstream = dag.get_task(teardown).get_flat_relative_ids(upstream=True)
        if teardown in TRAINING_SLICE_TEARDOWNS:
            # the training slice goes once training is over: evaluation and serving never wait on it
            assert "train" in upstream and not {"evaluate", "deploy", "write_report"} & upstream, teardown
        else:
            assert "write_report" in upstream, teardown
    assert "delete_node_pool" in dag.get_task("delete_ray_cluster").downstream_task_ids
    assert "delete_serve_node_pool" in dag.get_task("delete_service").downstream_task_ids
    # prep runs on the CPU cluster while the TPU pool is created: neither waits for the other
    assert "prep" in dag.get_task("create_prep_cluster").downstream_task_ids
    assert "train" in dag.get_task("prep").downstream_task_ids
    prep_up = dag.get_task("prep").get_flat_relative_ids(upstream=True)
    assert "create_node_pool" not in prep_up and "create_ray_cluster" not in prep_up
    assert "prep" not in dag.get_task("create_node_pool").get_flat_relative_ids(upstream=True)
    assert dag.get_task("prep").cluster.operator.task_id == "create_prep_cluster"
    assert dag.get_task("evaluate").cluster.operator.task_id == "create_prep_cluster"
    # ... so it asks for no TPU there (a CPU-only cluster would never place a TPU actor)
    assert "--tpu-per-host" not in dag.get_task("evaluate").entrypoint
    assert dag.get_task("train").cluster.operator.task_id == "create_ray_cluster"
    # the slice lease is taken before anything is created and given back once both slices' pools are gone
    assert {"create_node_pool", "create_prep_cluster"} <= dag.get_task("acquire_slice").downstream_task_ids
    assert {"delete_node_pool", "delete_serve_node_pool"} <= dag.get_task("release_slice").upstream_task_ids
    assert dag.get_task("acquire_slice").lease_root.endswith("/_tpuflow/slice-leases")
    # the ledger comes last, after every delete
    assert {"delete_node_pool", "delete_serve_node_pool", "delete_prep_cluster"} <= dag.get_task(
        "chip_ledger"
    ).upstream_task_ids
    # what reads the GKE API renders its connection from the Variable, as the node pool tasks do
    for task_id in ("chip_ledger", "create_node_pool"):
        assert "gcp_conn_id" in dag.get_task(task_id).template_fields, task_id
    train_task = dag.get_task("train")  # its chip-hour budget reads the pools' operations
    assert "budget" in train_task.template_fields and "gcp_conn_id" in train_task.budget.template_fields
    for task_id in ("create_ray_cluster", "create_prep_cluster", "deploy"):
        assert dag.get_task(task_id).retries == 0
    assert {"serve_topology", "keep_endpoint", "accelerator", "topology", "max_chip_hours"} <= set(dag.params)
    # queued capacity: the request comes after the pool and before the Ray pods that consume it, and goes
    # between the RayCluster and the pool; flex-start's wait holds training back
    for up, down in [
        ("create_node_pool", "request_capacity"),
        ("request_capacity", "create_ray_cluster"),
        ("request_capacity", "wait_for_flex_start"),
        ("wait_for_flex_start", "train"),
        ("create_serve_node_pool", "request_serve_capacity"),
        ("request_serve_capacity", "deploy"),
        ("delete_ray_cluster", "delete_provisioning_request"),
        ("delete_provisioning_request", "delete_node_pool"),
        ("delete_service", "delete_serve_provisioning_request"),
        ("delete_serve_provisioning_request", "delete_serve_node_pool"),
    ]:
        assert down in dag.get_task(up).downstream_task_ids, (up, down)
    for task_id, request in [("create_ray_cluster", "request_capacity"), ("deploy", "request_serve_capacity")]:
        assert request in dag.get_task(task_id).provisioning_request_name, task_id
    assert dag.get_task("request_capacity").node_pool_task_id == "create_node_pool"
    assert "max_run_duration_seconds" in dag.get_task("request_capacity").max_run_duration_seconds
    assert dag.params["max_run_duration_seconds"] is None


def test_prep_cluster_is_cpu_only() -> None:
    from tpuflow.kuberay.webhook_rules import tpu_worker_groups
    from tpuflow.pipeline.gke import prep_cluster_manifest

    manifest = prep_cluster_manifest("rayproject/ray:2.60.0-py311", {"A": "1"})
    spec = manifest["spec"]
    assert spec["workerGroupSpecs"] == [] and list(tpu_worker_groups(spec)) == []
    assert "name" not in manifest["metadata"]  # named per task instance, as its delete task finds it
    head = spec["headGroupSpec"]
    # Ray tasks (prep, evaluate) run on the head, so it declares its CPUs
    assert head["rayStartParams"]["num-cpus"] == head["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]


@pytest.mark.parametrize(
    ("accelerator", "topology", "expected"),
    [
        ("TPU-V6E", "", "1x1"),
        ("v5e", "", "1x1"),
        ("TPU-V4", "", "2x2x1"),
        ("tpu7x", "", "2x2x1"),
        ("TPU-V6E", "2x4", "2x4"),
    ],
)
def test_serve_slice_is_single_host(accelerator: str, topology: str, expected: str) -> None:
    from tpuflow.pipeline.gke import serve_slice

    tpu = serve_slice(accelerator, topology)
    assert tpu.topology == expected and tpu.num_hosts == 1


@pytest.mark.parametrize(
    ("accelerator", "topology", "fix"),
    [
        ("TPU-V6E", "16", "not a chip count"),  # a multi-host slice without its topology
        ("TPU-V6E", "2x2x1", "2D"),
        ("TPU-V6E", "16x32", "no such slice"),
        ("TPU-V5P", "1x1", "3D"),
    ],
)
def test_serve_slice_rejects(accelerator: str, topology: str, fix: str) -> None:
    from tpuflow.pipeline.gke import serve_slice

    with pytest.raises(UserInputError) as err:
        serve_slice(accelerator, topology)
    assert err.value.field == "params.serve_topology" and fix in str(err.value)


def test_serve_slice_may_be_multi_host() -> None:
    from tpuflow.pipeline.gke import check_gke_params

    tpu = check_gke_params({"accelerator": "TPU-V6E", "topology": "2x2", "framework": "jax", "accuracy_threshold": 0.9,
                            "serve_topology": "4x4"})["serve"]  # fmt: skip
    assert (tpu["topology"], tpu["num_hosts"], tpu["multi_host"], tpu["machine_type"]) == (
        "4x4",
        4,
        True,
        "ct6e-standard-4t",
    )


def run_context(task_id: str) -> dict[str, Any]:
    """The context of one task of the DAG run these teardown tests share."""
    return task_context(dag_id=DAG_ID, run_id="manual__keep", task_id=task_id)


def deploy_service() -> str:
    """The run's deploy task: the addition app as a RayService on a v6e 1x1 slice; returns its name."""
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator

    deploy = KubeRayDeployServiceOperator(
        task_id="deploy",
        tpu_slice={"accelerator": "TPU-V6E", "topology": "1x1"},
        image="rayproject/ray:2.60.0-py311",
        serve_config={"applications": [{"name": "addition", "import_path": "addition.serve_app:app_builder"}]},
        kubernetes_conn_id="kube_standin",
        poll_interval=0.1,
        wait_timeout=60,
    )
    return str(deploy.execute(run_context("deploy"))["name"])


def delete_service(keep: Any) -> dict[str, Any]:
    """The run's delete_service teardown of what deploy_service deployed."""
    from tpuflow.kuberay.operators import KubeRayDeleteServiceOperator

    svc = KubeRayDeleteServiceOperator(
        task_id="delete_service",
        service_task_id="deploy",
        keep=keep,
        kubernetes_conn_id="kube_standin",
        poll_interval=0.1,
        wait_timeout=60,
    )
    return dict(svc.execute(run_context("delete_service")))


def serve_pool_teardown(keep: Any, **kwargs: Any) -> Any:
    """The run's delete_serve_node_pool teardown task (GKEDeleteNodePoolOperator with keep); kwargs name the pool
    (created_by_task_id or node_pool_name) and may replace the fast polling and backoff."""
    from tpuflow.gke.operators import GKEDeleteNodePoolOperator

    return GKEDeleteNodePoolOperator(
        task_id="delete_serve_node_pool", keep=keep, project_id=PROJECT, location=ZONE, cluster_name=CLUSTER,
        gcp_conn_id="gke_standin", **{"poll_interval": 0.1, "retry_backoff": 0.1, **kwargs},
    )  # fmt: skip


def create_pool(gke: GKEApiStandin, name: str = "serve-pool", **config: Any) -> None:
    """A one-node ct6e-standard-1t node pool in ZONE, as the run's create tasks make them (config: more of its config)."""
    body = {"name": name, "config": {"machineType": "ct6e-standard-1t", **config}, "initialNodeCount": 1,
            "locations": [ZONE]}  # fmt: skip
    gke.create_node_pool(PROJECT, ZONE, CLUSTER, {"nodePool": body})


@pytest.mark.parametrize("keep", [True, "True"])
def test_endpoint_teardowns_keep_by_only_labelling_the_kept_objects_which_the_reaper_then_leaves(
    keep: Any, gke: GKEApiStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keep_endpoint: the three endpoint teardowns delete nothing; their only writes label the RayService, its
    ProvisioningRequest and PodTemplate (merge patches) and the serve pool (nodePools.update) kept, without their
    expiry. A reaper run after the run is over then takes the run's other leftovers and leaves the endpoint."""
    from tpuflow.capacity.operators import GKEDeleteProvisioningRequestOperator
    from tpuflow.capacity.provisioning_request import plan_provisioning_request, request_name
    from tpuflow.cost.reaper import FixedRunStates, ReaperScope, collect_orphans, reap
    from tpuflow.labels import EXPIRES_LABEL, KEPT_LABEL, gce_ownership_labels, kubernetes_ownership_labels
    from tpuflow.naming import TaskIdentity
    from tpuflow.tpu import TpuSlice
    from tpuflow_rehearsal.standins.capacity import POD_TEMPLATES, PROVISIONING_REQUESTS

    run_id, expires = "manual__keep", int(time.time() + 3600)
    kube = KubeRayStandin(tmp_path / "kube", launcher=FakeRayLauncher(), node_pools=GkeNodePools(gke), interval=0.05)
    with kube:
        point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
        # the serve pool as create_serve_node_pool makes it, and the training pool of the same run
        for pool, task in (("serve-pool", "create_serve_node_pool"), ("train-pool", "create_node_pool")):
            labels = gce_ownership_labels(TaskIdentity(DAG_ID, run_id, task), expires)
            create_pool(gke, pool, resourceLabels={**labels, "team": "ml"})
        # the serve slice's ProvisioningRequest and PodTemplate as request_serve_capacity makes them
        requester = TaskIdentity(DAG_ID, run_id, "request_serve_capacity")
        plan = plan_provisioning_request(tpu=TpuSlice.from_spec("v6e", "1x1"), node_pools=["serve-pool"],
                                         name=request_name(requester), namespace="default",
                                         labels=kubernetes_ownership_labels(requester))  # fmt: skip
        kube.store.create(POD_TEMPLATES, "default", plan.pod_template(0))
        kube.store.create(PROVISIONING_REQUESTS, "default", plan.provisioning_request())
        service = deploy_service()
        assert EXPIRES_LABEL in kube.store.get(RAYSERVICES, "default", service)["metadata"]["labels"]
        gke_seen, kube_seen = len(gke.requests), len(kube.api.requests)

        assert delete_service(keep) == {
            "kind": "RayService", "name": service, "namespace": "default", "kept": True, "existed": True,
            "deleted": False,
        }  # fmt: skip
        request = GKEDeleteProvisioningRequestOperator(
            task_id="delete_serve_provisioning_request", created_by_task_id="request_serve_capacity", keep=keep,
            kubernetes_conn_id="kube_standin",
        )  # fmt: skip
        kept_request = request.execute(run_context("delete_serve_provisioning_request"))
        assert kept_request["kept"] is True and kept_request["deleted"] == [] and kept_request["absent"] == []
        assert sorted(kept_request["marked_kept"]) == [f"podtemplate/{plan.name}", f"provisioningrequest/{plan.name}"]
        pool = serve_pool_teardown(keep, created_by_task_id="create_serve_node_pool")
        kept_pool = pool.execute(run_context("delete_serve_node_pool"))
        assert kept_pool["kept"] is True and kept_pool["deleted"] == [] and kept_pool["marked_kept"] == ["serve-pool"]

        # what keeping wrote: label updates of the kept objects, nothing else
        gke_writes = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in gke.requests[gke_seen:]
                      if r["method"] != "GET"]  # fmt: skip
        assert gke_writes == [("PUT", "serve-pool")]
        kube_writes = sorted((m, path.split("?")[0].rsplit("/", 2)[-2]) for m, path, _, _ in kube.api.requests[kube_seen:]
                             if m != "GET")  # fmt: skip
        assert kube_writes == [("PATCH", "podtemplates"), ("PATCH", "provisioningrequests"), ("PATCH", "rayservices")]
        labelled = [
            kube.store.get(RAYSERVICES, "default", service)["metadata"]["labels"],
            kube.store.get(PROVISIONING_REQUESTS, "default", plan.name)["metadata"]["labels"],
            kube.store.get(POD_TEMPLATES, "default", plan.name)["metadata"]["labels"],
        ]
        pools = {p["name"]: p["config"]["resourceLabels"] for p in gke.node_pools()}
        for labels in (*labelled, pools["serve-pool"]):
            assert labels[KEPT_LABEL] == "true" and EXPIRES_LABEL not in labels, labels
        assert pools["serve-pool"]["team"] == "ml" and pools["serve-pool"]["tpuflow-key"]  # the others stay
        assert KEPT_LABEL not in pools["train-pool"]

        # the run is over: one reaper run takes the training pool, and leaves the kept endpoint
        scope = ReaperScope(gcp_conn_id="gke_standin", project_id=PROJECT, location=ZONE, cluster_name=CLUSTER,
                            kubernetes_conn_id="kube_standin", namespace="default", local=False, leases=False)  # fmt: skip
        orphans = collect_orphans(scope, FixedRunStates({}), older_than=0)
        assert [(o.kind, o.name) for o in orphans] == [("node_pool", "train-pool")]
        assert sorted((k.kind, k.name) for k in orphans.kept) == [("node_pool", "serve-pool"), ("rayservice", service)]
        said: list[str] = []
        outcome = reap(orphans, dry_run=False, say=said.append)
        assert outcome["failed"] == [] and len(outcome["deleted"]) == 1, said
        assert said[0].startswith("skipped 2 kept endpoint resource(s)"), said
        assert [p["name"] for p in gke.node_pools()] == ["serve-pool"]
        assert [s["metadata"]["name"] for s in kube.store.list(RAYSERVICES)] == [service]
        assert kube.store.list(RAYCLUSTERS)  # the kept RayService's own cluster, judged with it
        assert kube.store.get(PROVISIONING_REQUESTS, "default", plan.name) is not None


def test_keeping_the_serve_pool_waits_like_the_delete_deferred_through_a_busy_cluster_and_once(
    gke: GKEApiStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's label update is waited for as a delete is: deferred, its operation in the triggerer, GKE's
    "too many operations" backed off; a retry of the teardown finds the pool marked and sends nothing."""
    import asyncio
    import importlib

    from airflow.sdk.exceptions import TaskDeferred

    from tpuflow.labels import EXPIRES_LABEL, KEPT_LABEL, gce_ownership_labels
    from tpuflow.naming import TaskIdentity

    monkeypatch.setenv("AIRFLOW_CONN_GKE_STANDIN", json.dumps(gke.airflow_connection(PROJECT)))
    labels = gce_ownership_labels(TaskIdentity(DAG_ID, "manual__keep", "create_serve_node_pool"), int(time.time()))
    for name, seconds, config in (("serve-pool", 0.2, {"resourceLabels": labels}), ("busy-pool", 60.0, {})):
        gke.operation_seconds = seconds
        create_pool(gke, name, **config)
        time.sleep(0.3 if name == "serve-pool" else 0)
    # busy-pool's create fills the cluster's operations quota until the first backoff is over
    gke.operation_seconds, gke.max_concurrent_operations = 0.2, 1

    def keeper(**kwargs: Any) -> Any:
        return serve_pool_teardown("True", created_by_task_id="create_serve_node_pool", retry_backoff=0.3, **kwargs)

    op, ctx, triggers = keeper(deferrable=True), run_context("delete_serve_node_pool"), []
    step = lambda: op.execute(ctx)  # noqa: E731
    while True:
        try:
            result = step()
            break
        except TaskDeferred as deferred:  # each trigger rebuilt from its JSON form, as the triggerer does
            classpath, kwargs = deferred.trigger.serialize()
            module, _, name = classpath.rpartition(".")
            trigger = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
            triggers.append(type(trigger).__name__)
            gke.max_concurrent_operations = 5
            event = asyncio.run(trigger.run().__anext__()).payload
            method = getattr(op, deferred.method_name)
            step = lambda method=method, event=event: method(ctx, event)  # noqa: E731
    assert result["marked_kept"] == ["serve-pool"] and result["kept"] is True, result
    assert triggers[0] == "NodePoolBackoffTrigger" and triggers[-1] == "GKENodePoolOperationTrigger", triggers
    pools = {p["name"]: p for p in gke.node_pools()}
    assert pools["serve-pool"]["config"]["resourceLabels"][KEPT_LABEL] == "true"
    assert EXPIRES_LABEL not in pools["serve-pool"]["config"]["resourceLabels"]
    assert "resourceLabels" not in pools["busy-pool"]["config"]  # only the kept pool is touched
    puts = [r for r in gke.requests if r["method"] == "PUT"]
    assert len(puts) >= 2 and {r["path"].rsplit("/", 1)[-1] for r in puts} == {"serve-pool"}  # refused, then sent
    # a retry of the teardown: already marked, nothing sent
    assert keeper().execute(run_context("delete_serve_node_pool"))["marked_kept"] == ["serve-pool"]
    assert len([r for r in gke.requests if r["method"] == "PUT"]) == len(puts)


@pytest.mark.parametrize("keep", [False, "False", None])
def test_endpoint_teardowns_delete_unless_kept(
    keep: Any, gke: GKEApiStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = KubeRayStandin(tmp_path / "kube", launcher=FakeRayLauncher(), node_pools=GkeNodePools(gke), interval=0.05)
    with kube:
        point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
        create_pool(gke)
        deploy_service()
        result = delete_service(keep)
        assert result["existed"] is True and result["deleted"] is True
        assert kube.store.list(RAYSERVICES) == []
        pool = serve_pool_teardown(keep, node_pool_name="serve-pool")
        pool.execute(run_context("delete_serve_node_pool"))
        assert gke.node_pools() == []


# --- end to end on the stand-ins ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "capacity",
    # both on the imitation of the control plane, in make test-long: make test runs the GKE pipeline end to end on
    # the real API server and KubeRay operator (tests/rehearsal/test_demo_gke.py, tests/pipeline/test_team_dag_gke_killed.py).
    # The plain run serves from a multi-host slice (v6e 4x4: one replica over the 4 hosts of its own serve slice).
    [pytest.param("queued", marks=pytest.mark.long), pytest.param("on-demand", marks=pytest.mark.long)],
)
def test_gke_pipeline_end_to_end_on_the_standins(
    capacity: str,
    dags_folder: Path,
    gke: GKEApiStandin,
    gcs_emulator: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every output in Cloud Storage, as on GKE: the output root is a bucket of the GCS emulator. With queued
    capacity the slice's ProvisioningRequest is Provisioned (after the stand-in's delay), the TPU pods consume
    it, the run completes and the teardown deletes the request with the pools."""
    from support.gcs_bucket import list_bucket

    from tpuflow.storage import EMULATOR_ENV, read_text
    from tpuflow_rehearsal.gcs_emulator import ensure_buckets
    from tpuflow_rehearsal.standins.capacity import POD_TEMPLATES, PROVISIONING_REQUESTS

    # a bucket per case: the emulator lives for the session, and the second case would adopt the first's
    # finished training run (same DAG, date and slice) and train no step
    bucket = f"tpuflow-gke-outputs-{capacity}"
    ensure_buckets(gcs_emulator.url, [bucket])
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)  # the Airflow side, and the stand-in's Ray processes
    launcher = RecordingLauncher(tmp_path / "ray", head_cpus=2, host_cpus=1, timeout=600)
    kube = KubeRayStandin(
        tmp_path / "kube", launcher=launcher, node_pools=GkeNodePools(gke, cluster=CLUSTER_PATH), interval=0.2
    )
    with kube:
        point_airflow_at(monkeypatch, gke, kube, f"gs://{bucket}/runs")
        monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_TPU_CAPACITY", capacity)
        dag = load_dag(dags_folder, poll=0.5)
        # The orchestration on GKE is what this run checks; the demo runs train the defaults behind the gate.
        conf = {
            "accelerator": "TPU-V6E",
            "topology": "2x2",
            "framework": "jax",
            "train_steps": 300,
            "accuracy_threshold": 0,
            "num_train": 3000,
            # bounds each pool's GKE maxRunDuration: the budget spent on that slice alone, plus 900 s
            "max_chip_hours": 10,
        }
        multi_host_serve = capacity == "on-demand"
        kept = not multi_host_serve
        if kept:  # the endpoint is kept while it serves, and goes once Serve saw no request for 6 s (+ 30 s margin)
            conf.update(keep_endpoint=True, idle_timeout=0.1)
        if multi_host_serve:
            conf["serve_topology"] = "4x4"  # v6e 2x4 would be one 8-chip host (ct6e-standard-8t)
        serve_chips, serve_machine = (16, "ct6e-standard-4t") if multi_host_serve else (1, "ct6e-standard-1t")
        started = time.time()
        run = dag.test(run_conf=conf)
        elapsed = time.time() - started
        states = task_states(run)
        assert run.state == "success", states
        assert set(states.values()) == {"success"}, states
        print(f"tpu_llm_pipeline_gke on the stand-ins: {elapsed:.0f}s")

        tis = {ti.task_id: ti for ti in run.get_task_instances()}
        cluster = tis["create_ray_cluster"].xcom_pull(task_ids="create_ray_cluster")
        assert cluster["dashboard_url"].startswith("http://127.0.0.1:") and cluster["slice"]["topology"] == "2x2"
        deployed = tis["deploy"].xcom_pull(task_ids="deploy")
        assert deployed["applications"] == {"addition": "RUNNING"}
        # the replica's placement (a multi-host one reserves its whole slice: the topology is in its config)
        (app,) = tis["build_serve_config"].xcom_pull(task_ids="build_serve_config")["applications"]
        assert app["args"]["accelerator_type"] == "TPU-V6E"
        assert app["args"]["accelerator_config"] == {"kind": "tpu", "topology": "4x4" if multi_host_serve else "1x1"}
        assert app["args"]["chips_per_host"] == (4 if multi_host_serve else 1), app["args"]
        objects = list_bucket(bucket, f"runs/{DAG_ID}/")
        (run_dir,) = {n.rsplit("/", 1)[0] for n in objects if n.endswith("/report.json")}
        relative = [n[len(run_dir) + 1 :] for n in objects if n.startswith(run_dir + "/")]
        assert "data/_SUCCESS" in relative and any(n.startswith("data/train/") for n in relative), relative
        assert any(n.startswith("train/") and n.endswith("/meta.json") for n in relative), relative  # checkpoints
        assert "eval/jax.json" in relative and any(n.startswith("logs/") for n in relative), relative
        report = json.loads(read_text(f"gs://{bucket}/{run_dir}/report.json") or "{}")
        assert report["output_dir"] == f"gs://{bucket}/{run_dir}"
        assert 0 <= report["accuracy"] <= 1 and isinstance(report["sample_completion"], str)  # eval and the endpoint
        assert report["endpoint"] == f"{deployed['serve_url']}/addition/v1"
        verdict = tis["serve_until_idle"].xcom_pull(task_ids="serve_until_idle")
        if kept:  # read from the RayService head's metrics port (KubeRay's 8080, the stand-in's live one)
            assert deployed["metrics_url"].startswith("http://127.0.0.1:"), deployed
            assert verdict["keep"] is False and verdict["stopped"] == "idle" and verdict["requests"] >= 1, verdict
            assert verdict["stopped_at"] - verdict["last_busy_at"] >= 6 + 30
        else:
            assert verdict == {"keep": False, "reason": NOT_KEPT}

        # The ledger: per slice, chips x (delete end - create start) of the stand-in's own operations
        ledger = tis["chip_ledger"].xcom_pull(task_ids="chip_ledger")
        assert report["ledger"] == ledger
        assert ledger["endpoint"] == verdict  # why the serve slice went
        operations = gke.state()["operations"]
        for entry, chips in zip(ledger["slices"], (4, serve_chips), strict=True):
            (pool,) = entry["pools"]
            ops = {o["operationType"]: o for o in operations if o["targetLink"].endswith(f"/nodePools/{pool}")}
            start = rfc3339_to_unix(ops["CREATE_NODE_POOL"]["startTime"])
            end = rfc3339_to_unix(ops["DELETE_NODE_POOL"]["endTime"])
            assert entry["chips"] == chips and entry["open"] is False and entry["zone"] == "us-east5-b"
            assert abs(entry["created_at"] - start) < 1 and abs(entry["deleted_at"] - end) < 1, (entry, ops)
        assert [s["role"] for s in ledger["slices"]] == ["train", "serve"]
        train = tis["train"].xcom_pull(task_ids="train")
        assert ledger["training_chip_hours"] == pytest.approx(4 * train["fit_s"] / 3600, rel=1e-3)
        print(f"chip-hours on the stand-ins: {ledger['chip_hours']:.5f} billed, ratio {ledger['chip_hours_ratio']}")
        # Goodput: every billed second of each slice has one cause, from the GKE operations and the work spans
        train_slice, serve_slice = ledger["slices"]
        for entry in ledger["slices"]:
            assert sum(entry["timeline"]["seconds"].values()) == pytest.approx(entry["seconds"], abs=0.01), entry
        measured = train_slice["timeline"]["seconds"]
        assert {"provisioning", "cluster_start", "preflight", "compile", "productive"} <= set(measured), measured
        assert "evaluation" not in measured and "data_prep" not in measured  # both ran on the CPU cluster
        assert serve_slice["timeline"]["seconds"]["serving"] > 0 and "productive" not in serve_slice["timeline"]
        assert ledger["goodput"]["steps"]["productive"] + ledger["goodput"]["steps"]["compile"] == 300
        assert 0 < ledger["goodput"]["goodput"] < 1
        print(f"goodput on the stand-ins: {ledger['goodput']['goodput']}; {ledger['goodput']['chip_seconds']}")

        # Node pools: the training slice (one ct6e-standard-4t node) and the serve slice (1x1), both deleted.
        created = [
            (r["body"] or {}).get("nodePool", {}).get("config", {}).get("machineType") for r in _node_pool_creates(gke)
        ]
        assert sorted(created) == sorted(["ct6e-standard-4t", serve_machine]), gke.requests
        # GKE's own hard stop on each pool, from the budget guard's bound for its role
        max_runs = {
            r["body"]["nodePool"]["name"]: r["body"]["nodePool"]["config"].get("maxRunDuration")
            for r in _node_pool_creates(gke)
        }
        bounds = tis["budget_guard"].xcom_pull(task_ids="budget_guard")["max_run_seconds"]
        pool_labels = {
            r["body"]["nodePool"]["name"]: r["body"]["nodePool"]["config"].get("resourceLabels") or {}
            for r in _node_pool_creates(gke)
        }
        assert bounds == {"train": 10 * 3600 // 4 + 900, "serve": 10 * 3600 // serve_chips + 900}, bounds
        for entry in ledger["slices"]:
            (pool,) = entry["pools"]
            # a kept endpoint's pool too: the admin's kept lifetime (24 h by default) or the budget's bound, shorter
            deadline = f"{bounds[entry['role']]}s"
            assert max_runs[pool] == deadline, max_runs
            # and, watched (idle_timeout), no expiry either: the reaper judges it by its run, running while it serves
            labels = pool_labels[pool]
            assert labels[GCE_OWNER_RUN_LABEL] and (EXPIRES_LABEL in labels) != (kept and entry["role"] == "serve")
        (service_labels,) = [
            obj["metadata"].get("labels") or {}
            for _, event, obj in kube.store.events_since(RAYSERVICES, None, 0) or []
            if event == "ADDED"
        ]
        assert (EXPIRES_LABEL in service_labels) != kept and service_labels[OWNER_RUN_LABEL], service_labels
        queued = [(r["body"] or {}).get("nodePool", {}).get("queuedProvisioning") for r in _node_pool_creates(gke)]
        assert queued == [{"enabled": True}] * 2 if capacity == "queued" else not any(queued), queued
        requested = tis["request_capacity"].xcom_pull(task_ids="request_capacity")
        if capacity == "queued":
            # the slice's request, named for the run, was Provisioned before the RayCluster was made
            assert requested["name"] and "skipped" not in requested, requested
        else:
            assert requested["skipped"], requested
        wait_until_empty(gke, kube)
        assert gke.node_pools() == []
        assert kube.store.list(PROVISIONING_REQUESTS) == [] and kube.store.list(POD_TEMPLATES) == []
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []
        # Three Ray clusters were started (CPU prep, TPU training, then the RayService's); none is left.
        from tpuflow.local.cluster import _pids_referencing

        assert len(launcher.clusters) == 3
        for local in launcher.clusters:
            assert not local.is_alive() and _pids_referencing(local.temp_dir) == [], local.name
        assert kube.controller.errors == []


@pytest.fixture
def failing_run_standins(
    gke: GKEApiStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., AbstractContextManager[KubeRayStandin]]:
    """Starts the Kubernetes stand-in (simulated KubeRay, a FakeRayLauncher unless given) over ``cluster``'s node
    pools of the GKE stand-in, with Airflow's connections and Variables pointed at both (and the TPU capacity
    Variable set, if given), for a run that is to fail."""

    @contextmanager
    def start(
        cluster: str = CLUSTER_PATH, launcher: FakeRayLauncher | None = None, capacity: str | None = None
    ) -> Iterator[KubeRayStandin]:
        node_pools = GkeNodePools(gke, cluster=cluster)
        with KubeRayStandin(
            tmp_path / "kube", launcher=launcher or FakeRayLauncher(), node_pools=node_pools, interval=0.1
        ) as kube:
            point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
            if capacity is not None:
                monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_TPU_CAPACITY", capacity)
            yield kube

    return start


def _failed(run: Any) -> dict[str, str]:
    """The task states of a run that failed."""
    states = task_states(run)
    assert run.state == "failed", states
    return states


def _node_pool_creates(gke: GKEApiStandin) -> list[dict[str, Any]]:
    """The requests to the GKE stand-in that created a node pool, in order."""
    return [r for r in gke.requests if r["method"] == "POST" and r["path"].endswith("/nodePools")]


@pytest.mark.slow
def test_a_raycluster_that_never_becomes_ready_fails_the_run_and_teardown_deletes_everything(
    dags_folder: Path, gke: GKEApiStandin, failing_run_standins: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    # The Kubernetes connection reaches a cluster whose nodes are not the GKE cluster's that got the slice's
    # node pool: the TPU worker pods stay Pending (FailedScheduling) and the RayCluster never becomes ready.
    other_cluster = f"projects/{PROJECT}/locations/{ZONE}/clusters/another-cluster"
    launcher = FakeRayLauncher()
    with failing_run_standins(other_cluster, launcher) as kube:
        dag = load_dag(dags_folder, poll=0.3)
        deadline = 20.0
        dag.get_task("create_ray_cluster").wait_timeout = deadline  # the configured deadline, test-sized
        started = time.time()
        states = _failed(
            dag.test(run_conf={"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t"})
        )
        elapsed = time.time() - started
        assert states["check_params"] == "success" and states["create_node_pool"] == "success"
        assert states["create_ray_cluster"] == "failed"
        assert {states[t] for t in ("train", "evaluate", "deploy", "smoke_test")} == {"upstream_failed"}
        assert {t: states[t] for t in TEARDOWNS} == dict.fromkeys(TEARDOWNS, "success"), states
        text = "".join(capfd.readouterr())
        # A clear reason, within the deadline: KubeRay's state plus the scheduler's FailedScheduling event.
        assert "didn't match Pod's node affinity/selector" in text, text[-5000:]
        assert elapsed < deadline + 120, elapsed
        # The two-host pool existed while the cluster waited, then teardown removed the pool and the RayCluster.
        assert len(_node_pool_creates(gke)) == 1
        assert gke.node_pools() == []
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []
        # only the CPU prep cluster ever started (it has no TPU workers to wait for)
        assert [handle.spec.tpu for handle in launcher.launched] == [None]


@pytest.mark.slow
@pytest.mark.long  # a DAG run of its own (about 2 min here); make test proves the wiring with the shape test
def test_queued_capacity_that_never_arrives_fails_at_the_deadline_and_teardown_leaves_nothing(
    dags_folder: Path, gke: GKEApiStandin, failing_run_standins: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    from tpuflow_rehearsal.standins.capacity import POD_TEMPLATES, PROVISIONING_REQUESTS

    gke.capacity.update({"queued": {"available": False, "failAfterSeconds": 3600}})
    with failing_run_standins(capacity="queued") as kube:
        dag = load_dag(dags_folder, poll=0.3)
        dag.get_task("request_capacity").wait_timeout = 5.0  # the configured deadline, test-sized
        conf = {"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t"}
        states = _failed(dag.test(run_conf={**conf, "max_run_duration_seconds": 3600}))
        assert states["create_node_pool"] == "success" and states["request_capacity"] == "failed", states
        assert states["create_ray_cluster"] == "upstream_failed" and states["train"] == "upstream_failed"
        assert {t: states[t] for t in TEARDOWNS} == dict.fromkeys(TEARDOWNS, "success"), states
        text = "".join(capfd.readouterr())
        assert "Provisioned=False: CapacityIsNotFound" in text and "by the deadline" in text, text[-5000:]
        queued_pools = _node_pool_creates(gke)
        assert queued_pools and queued_pools[0]["body"]["nodePool"]["queuedProvisioning"] == {"enabled": True}
        assert gke.node_pools() == []
        assert kube.store.list(PROVISIONING_REQUESTS) == [] and kube.store.list(POD_TEMPLATES) == []
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []
        assert kube.capacity is not None and kube.capacity.errors == [] and kube.controller.errors == []


@pytest.mark.slow
def test_slices_above_the_projects_quota_fail_the_first_task_and_nothing_is_created(
    dags_folder: Path, gke: GKEApiStandin, failing_run_standins: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    # Two v6e 2x4 slices on spot need 16 preemptible chips; the project has 8 in the cluster's region.
    gke.quotas.set("PREEMPTIBLE-TPU-V6E-per-project-region", 8, region=ZONE.rsplit("-", 1)[0])
    launcher = FakeRayLauncher()
    with failing_run_standins(launcher=launcher, capacity="spot") as kube:
        dag = load_dag(dags_folder, poll=0.3)
        conf = {"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t", "num_slices": 2}
        states = _failed(dag.test(run_conf=conf))
        assert states["check_params"] == "failed", states
        assert not [t for t, s in states.items() if s == "success"], states
        text = "".join(capfd.readouterr())
        assert (
            "params.num_slices=2 is invalid: the run needs 16 v6e chips at once (2 slices of 8 chips, v6e 2x4) "
            "in us-east5, but PREEMPTIBLE-TPU-V6E-per-project-region allows 8 (spot)"
        ) in text, text[-5000:]
        assert [r for r in gke.requests if r["method"] != "GET"] == []  # not one pool or policy create
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []
        assert launcher.launched == []


@pytest.mark.parametrize(
    ("node_zone", "zones_param", "expected"),
    [
        ("us-east5-a,us-east5-b", None, "us-east5-a,us-east5-b"),  # the builder's literal
        ("us-east5-a", "us-east5-c", "us-east5-c"),  # the run's Param wins
        ("{{ params.region }}-a", None, "us-east5-a"),  # one template with text around it
        ("{{ params.region }}-a,{{ params.region }}-b", "", "us-east5-a,us-east5-b"),  # several templates
        ("{{ params.blank }}", None, ""),  # a Variable left empty: no zone, as none given
        (None, None, ""),
    ],
)
def test_the_node_zone_is_the_runs_zones_param_else_the_builders_value_rendered(
    node_zone: str | None, zones_param: str | None, expected: str
) -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.gke import build_gke_pipeline_dag

    dag = build_gke_pipeline_dag(
        "acme_zones", workload=ADDITION, project_id="acme-ml-prod", location="us-east5", cluster_name="tpus",
        image="ghcr.io/acme/ray:2.60",
        node_zone=node_zone,
    )  # fmt: skip
    op = dag.get_task("create_node_pool")
    params = {
        **{k: v.value if hasattr(v, "value") else v for k, v in dag.params.items()},
        "region": "us-east5",
        "blank": "",
    }
    params["zones"] = zones_param
    assert op.render_template(op.node_zone, {"params": params}) == expected
