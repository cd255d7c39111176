"""Queued provisioning and flex-start on the real control plane: tpuflow's capacity operators, as a DAG calls
them, against the real API server serving the ProvisioningRequest CRD, with GKE's autoscaler played as its own
user (tpuflow_rehearsal.played_autoscaler), the real scheduler binding the pods and the real KubeRay operator."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException
from support.airflow_context import task_context
from support.dag_run import RUN, Run, RunTI

from tpuflow.capacity.operators import (
    GKECreateProvisioningRequestOperator,
    GKEDeleteProvisioningRequestOperator,
    GKEWaitForFlexStartCapacityOperator,
)
from tpuflow.capacity.provisioning_request import CONSUME_ANNOTATION
from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator
from tpuflow.kuberay.operators import KubeRayCreateClusterOperator, KubeRayDeleteClusterOperator
from tpuflow_rehearsal.nodes import network as net
from tpuflow_rehearsal.nodes.kube_rest import KubeError
from tpuflow_rehearsal.played_autoscaler import AUTOSCALER_USER
from tpuflow_rehearsal.rehearsal import RehearsalStack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(net.available() is not None, reason=str(net.available())),
]

GCP_CONN, KUBE_CONN = "rehearsal_gcp", "rehearsal_kube"
SLICE = {"tpu_slice": {"accelerator": "v6e", "topology": "2x4", "machine_type": "ct6e-standard-4t"}}  # two hosts
FAST_POOL = {"poll_interval": 0.2, "retry_backoff": 0.2, "max_backoff": 1.0}
KUBE = {"kubernetes_conn_id": KUBE_CONN, "poll_interval": 0.5}
REQUESTS = "/apis/autoscaling.x-k8s.io/v1/namespaces/default/provisioningrequests"
PODS = "/api/v1/namespaces/default/pods"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    """``check()`` every half second (each asks the real API server) until truthy; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert value, f"timed out waiting for {what} (last: {value!r})"
    return value


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RehearsalStack]:
    with RehearsalStack(tmp_path_factory.mktemp("rehearsal-capacity"), operation_seconds=0) as running:
        yield running
        assert running.autoscaler is not None and running.autoscaler.errors == []


@pytest.fixture
def dag(stack: RehearsalStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    """One DAG run's tasks with their Airflow connections to the rehearsal; the capacity knobs put back after."""
    for key, value in stack.airflow_connections(GCP_CONN, KUBE_CONN).items():
        monkeypatch.setenv(key, value)
    stack.gke.capacity.update({"queued": {"delaySeconds": 0.5}, "flex-start": {"delaySeconds": 0.5}})
    yield Run()
    stack.gke.capacity.update(
        {
            "queued": {"available": True, "delaySeconds": 1, "failAfterSeconds": 60},
            "flex-start": {"available": True, "delaySeconds": 1},
        }
    )


def pool_op(stack: RehearsalStack, capacity: str) -> GKECreateTPUNodePoolOperator:
    return GKECreateTPUNodePoolOperator(
        task_id="create_node_pool", project_id=stack.project, location=stack.zone, cluster_name=stack.cluster,
        gcp_conn_id=GCP_CONN, capacity=capacity, **SLICE, **FAST_POOL,
    )  # fmt: skip


def request_op(**kwargs: Any) -> GKECreateProvisioningRequestOperator:
    args = {"node_pool_task_id": "create_node_pool", "wait_timeout": 60, **SLICE, **KUBE, **kwargs}
    return GKECreateProvisioningRequestOperator(task_id="request_capacity", **args)


def cluster_op(provisioning_request: str | None = None) -> Any:
    return KubeRayCreateClusterOperator(
        task_id="create_ray_cluster", image="rayproject/ray:2.60.0-py311",
        provisioning_request_name=provisioning_request, wait_timeout=240, **SLICE, **KUBE,
    )  # fmt: skip


def post_cluster(stack: RehearsalStack, provisioning_request: str | None = None) -> str:
    """The RayCluster the create task would make, posted without waiting (the capacity tasks wait)."""
    body = cluster_op(provisioning_request).build_body(
        task_context(RunTI(**RUN, task_id="create_ray_cluster")), "default"
    )
    stack.api().request("POST", "/apis/ray.io/v1/namespaces/default/rayclusters", body)
    return str(body["metadata"]["name"])


def teardown(stack: RehearsalStack, run: Run) -> None:
    for op in (
        KubeRayDeleteClusterOperator(
            task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", wait_timeout=120, **KUBE
        ),
        GKEDeleteProvisioningRequestOperator(task_id="delete_request", created_by_task_id="request_capacity", **KUBE),
        GKEDeleteNodePoolOperator(
            task_id="delete_node_pool",
            created_by_task_id="create_node_pool",
            project_id=stack.project,
            location=stack.zone,
            cluster_name=stack.cluster,
            gcp_conn_id=GCP_CONN,
            **FAST_POOL,
        ),  # fmt: skip
    ):
        run.execute(op)


def pool_nodes(stack: RehearsalStack, pool: str) -> list[dict[str, Any]]:
    selector = f"cloud.google.com/gke-nodepool={pool}"
    return stack.api().items("/api/v1/nodes", labelSelector=selector)


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def test_a_queued_request_is_provisioned_on_the_real_api_and_its_pods_are_bound_to_its_nodes(
    stack: RehearsalStack, dag: Run
) -> None:
    api = stack.api()
    pool = dag.execute(pool_op(stack, "queued"))["node_pool_name"]
    assert pool_nodes(stack, pool) == []  # a queued pool starts empty
    requested = dag.execute(request_op())
    name = requested["name"]
    assert "provisioned" in requested["message"]
    request = api.request("GET", f"{REQUESTS}/{name}")
    seen = conditions(request)
    assert seen["Accepted"]["status"] == "True"
    assert (seen["Provisioned"]["status"], seen["Provisioned"]["reason"]) == ("True", "CapacityIsProvisioned")
    nodes = wait_for("the booked nodes", lambda: len(n := pool_nodes(stack, pool)) == 2 and n)
    # the played autoscaler reports on requests; it may not delete them or make pods
    autoscaler = stack.api(AUTOSCALER_USER)
    for method, path, body in (("DELETE", f"{REQUESTS}/{name}", None), ("POST", PODS, {"metadata": {"name": "x"}})):
        with pytest.raises(KubeError) as denied:
            autoscaler.request(method, path, body)
        assert denied.value.status == 403

    cluster = post_cluster(stack, name)

    def bound() -> list[dict[str, Any]]:
        workers = api.items(PODS, labelSelector=f"ray.io/cluster={cluster},ray.io/node-type=worker")
        return workers if len(workers) == 2 and all(p["spec"].get("nodeName") for p in workers) else []

    workers = wait_for("the workers bound by the scheduler", bound)
    assert {p["spec"]["nodeName"] for p in workers} == {n["metadata"]["name"] for n in nodes}
    assert {p["metadata"]["annotations"][CONSUME_ANNOTATION] for p in workers} == {name}

    dag.execute(
        KubeRayDeleteClusterOperator(
            task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", wait_timeout=120, **KUBE
        )
    )
    dag.execute(
        GKEDeleteProvisioningRequestOperator(task_id="delete_request", created_by_task_id="request_capacity", **KUBE)
    )
    wait_for("the nodes released", lambda: not pool_nodes(stack, pool))
    assert stack.gke.node_pools()[0]["nodeCount"] == 0
    teardown(stack, dag)
    wait_for("nothing left", lambda: not stack.leftovers(), timeout=60)


def test_a_queued_request_without_capacity_fails_with_gkes_reason(stack: RehearsalStack, dag: Run) -> None:
    stack.gke.capacity.update({"queued": {"available": False, "failAfterSeconds": 4}})
    pool = dag.execute(pool_op(stack, "queued"))["node_pool_name"]
    seen: list[dict[str, dict[str, Any]]] = []
    done = threading.Event()

    def watch() -> None:  # the request's conditions on the real API while the task waits
        while not done.is_set():
            seen.extend(conditions(r) for r in stack.api().items(REQUESTS))
            done.wait(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with pytest.raises(AirflowException) as err:
            dag.execute(request_op())
    finally:
        done.set()
        watcher.join(5)
    message = str(err.value)
    assert "Failed: CapacityIsNotFound: CA could not find requested capacity" in message and "\n" not in message
    waiting = [c["Provisioned"] for c in seen if "Provisioned" in c]
    assert waiting and (waiting[0]["status"], waiting[0]["reason"]) == ("False", "CapacityIsNotFound")
    assert "Failed" not in seen[0]
    assert stack.api().items(REQUESTS) == []  # the failed task withdrew its request
    assert pool_nodes(stack, pool) == []
    teardown(stack, dag)
    wait_for("nothing left", lambda: not stack.leftovers(), timeout=60)


@pytest.mark.long  # a real KubeRay cluster on the grown pool (~95 s): make test keeps the queued cases above
def test_a_flex_start_pool_grows_to_the_slice_for_a_rayclusters_pods_and_back_to_zero(
    stack: RehearsalStack, dag: Run
) -> None:
    api = stack.api()
    pool = dag.execute(pool_op(stack, "flex-start"))["node_pool_name"]
    assert dag.execute(request_op())["name"] is None  # not queued: no ProvisioningRequest
    cluster = post_cluster(stack)
    waited = dag.execute(
        GKEWaitForFlexStartCapacityOperator(
            task_id="wait_for_flex_start",
            node_pool_task_id="create_node_pool",
            ray_cluster_task_id="create_ray_cluster",
            wait_timeout=90,
            **SLICE,
            **KUBE,
        )  # fmt: skip
    )
    assert "flex-start capacity arrived" in waited["message"]
    assert len(pool_nodes(stack, pool)) == 2 and stack.gke.node_pools()[0]["nodeCount"] == 2
    events = api.items("/api/v1/namespaces/default/events")
    scale_up = [e for e in events if e["reason"] == "TriggeredScaleUp"]
    assert scale_up and scale_up[0]["source"]["component"] == "cluster-autoscaler"
    assert scale_up[0]["involvedObject"]["name"].startswith(cluster)
    ready = dag.execute(cluster_op())  # adopts the RayCluster and waits for the real operator's ready
    assert ready["name"] == cluster
    state = api.request("GET", f"/apis/ray.io/v1/namespaces/default/rayclusters/{cluster}")["status"]
    assert state["state"] == "ready" and state["readyWorkerReplicas"] == 2

    dag.execute(
        KubeRayDeleteClusterOperator(
            task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", wait_timeout=120, **KUBE
        )
    )
    wait_for(
        "the pool back to zero", lambda: not pool_nodes(stack, pool) and not stack.gke.node_pools()[0]["nodeCount"]
    )
    teardown(stack, dag)
    wait_for("nothing left", lambda: not stack.leftovers(), timeout=60)
