"""The stand-ins' capacity machinery: queued provisioning (ProvisioningRequest) and the flex-start autoscaler.

GKE stand-in + Kubernetes stand-in + simulated KubeRay (fake launcher, no Ray), the way StandinStack
wires them; requests go through the real kubernetes client where the operators would use it.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from support.node_pool_plans import node_pool_plan
from support.polling import until

from tpuflow.capacity.provisioning_request import CONSUME_ANNOTATION, plan_provisioning_request
from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest
from tpuflow.kuberay.status import raycluster_verdict
from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.capacity import POD_TEMPLATES, PROVISIONING_REQUESTS
from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, GkeNodePools, KubeRayStandin
from tpuflow_rehearsal.standins.kubernetes_api import EVENTS, PODS, RAYCLUSTERS

PROJECT, ZONE, CLUSTER = "tpu-proj-123", "us-east5-b", "tpu-cluster"
CLUSTER_PATH = f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}"
V6E = TpuSlice.from_spec("v6e", "4x4")
NS = "default"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[GKEApiStandin, KubeRayStandin]]:
    gke = GKEApiStandin(operation_seconds=0.05, clusters=[CLUSTER_PATH])
    gke.capacity.update(
        {
            "queued": {"delaySeconds": 0.1, "failAfterSeconds": 1.0},
            "flex-start": {"delaySeconds": 0.1},
        }
    )
    kube = KubeRayStandin(
        tmp_path, launcher=FakeRayLauncher(), node_pools=GkeNodePools(gke, cluster=CLUSTER_PATH), interval=0.05
    )
    with gke, kube:
        yield gke, kube
    assert kube.capacity is not None and kube.capacity.errors == []
    assert kube.controller.errors == []


def make_pool(gke: GKEApiStandin, capacity: str) -> dict[str, Any]:
    plan = node_pool_plan(project_id=PROJECT, location=ZONE, cluster_name=CLUSTER, capacity=capacity)
    gke.create_node_pool(PROJECT, ZONE, CLUSTER, {"nodePool": plan.body()})
    [pool] = until(gke.node_pools, lambda pools: pools[0]["status"] == "RUNNING")
    assert pool["status"] == "RUNNING" and pool["nodeCount"] == 0  # queued and flex-start pools start empty
    return pool


def ask(kube: KubeRayStandin, pool: str, name: str = "req", **extra: Any) -> None:
    """PodTemplate through the store, the ProvisioningRequest through the kubernetes client (the HTTP path)."""
    plan = plan_provisioning_request(tpu=V6E, node_pools=[pool], name=name, namespace=NS, **extra)
    [template] = plan.pod_templates()
    kube.store.create(POD_TEMPLATES, NS, template)
    api = config.new_client_from_config(config_file=str(kube.kubeconfig_path))
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "autoscaling.x-k8s.io", "v1", NS, "provisioningrequests", plan.provisioning_request()
    )


def conditions(kube: KubeRayStandin, name: str = "req") -> dict[str, dict[str, Any]]:
    obj = kube.store.find(PROVISIONING_REQUESTS, NS, name) or {}
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def cluster(kube: KubeRayStandin, name: str, provisioning_request: str | None = None) -> None:
    template = RayClusterTemplate(
        tpu=V6E, image="rayproject/ray:2.60.0-py311", provisioning_request=provisioning_request
    )
    kube.store.create(RAYCLUSTERS, NS, raycluster_manifest(template, name=name))


def ready(kube: KubeRayStandin, name: str, timeout: float = 10.0) -> bool:
    return until(lambda: raycluster_verdict(kube.store.find(RAYCLUSTERS, NS, name)), lambda v: v.ready, timeout).ready


def workers(kube: KubeRayStandin, name: str) -> list[dict[str, Any]]:
    return kube.store.list(PODS, NS, f"ray.io/cluster={name},ray.io/node-type=worker")


def test_a_queued_request_books_the_slice_for_the_pods_that_consume_it(stack):
    gke, kube = stack
    pool = make_pool(gke, "queued")
    ask(kube, pool["name"])

    provisioned = until(lambda: conditions(kube), lambda c: c.get("Provisioned", {}).get("status") == "True")
    assert provisioned["Accepted"]["status"] == "True"
    assert provisioned["Provisioned"]["reason"] == "CapacityIsProvisioned"
    [pool] = gke.node_pools()
    assert pool["nodeCount"] == 4 and pool["bookings"] == {"req": 4}

    # Pods that do not consume the request never land on its nodes; those that do, do.
    cluster(kube, "stranger")
    cluster(kube, "consumer", provisioning_request="req")
    assert ready(kube, "consumer")
    assert {p["metadata"]["annotations"][CONSUME_ANNOTATION] for p in workers(kube, "consumer")} == {"req"}
    assert not raycluster_verdict(kube.store.find(RAYCLUSTERS, NS, "stranger")).ready
    assert all(p["status"]["phase"] == "Pending" for p in workers(kube, "stranger"))

    # Deleting the request gives the nodes back.
    kube.store.delete(PROVISIONING_REQUESTS, NS, "req")
    assert until(lambda: gke.node_pools()[0]["nodeCount"], lambda n: n == 0) == 0


def test_a_queued_request_without_capacity_waits_with_gkes_reason_then_fails(stack):
    gke, kube = stack
    gke.capacity.update({"queued": {"available": False}})
    pool = make_pool(gke, "queued")
    ask(kube, pool["name"])

    waiting = until(lambda: conditions(kube), lambda c: "Provisioned" in c)
    assert waiting["Provisioned"]["status"] == "False" and waiting["Provisioned"]["reason"] == "CapacityIsNotFound"
    failed = until(lambda: conditions(kube), lambda c: "Failed" in c)
    assert failed["Failed"]["status"] == "True" and failed["Failed"]["reason"] == "CapacityIsNotFound"
    assert gke.node_pools()[0]["nodeCount"] == 0


def test_max_run_duration_revokes_the_capacity_and_bad_values_fail(stack):
    gke, kube = stack
    pool = make_pool(gke, "queued")
    ask(kube, pool["name"], max_run_duration_seconds=1)
    revoked = until(lambda: conditions(kube), lambda c: "CapacityRevoked" in c)
    assert revoked["CapacityRevoked"]["status"] == "True"
    assert gke.node_pools()[0]["nodeCount"] == 0

    # A request whose parameter is out of GKE's range (written by hand, past tpuflow's own check).
    body = {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": "bad"},
        "spec": {
            "provisioningClassName": "queued-provisioning.gke.io",
            "parameters": {"maxRunDurationSeconds": "604801"},
            "podSets": [{"count": 4, "podTemplateRef": {"name": "req"}}],
        },
    }
    kube.store.create(PROVISIONING_REQUESTS, NS, body)
    bad = until(lambda: conditions(kube, "bad"), lambda c: "Failed" in c)
    assert bad["Failed"]["reason"] == "InvalidParameters" and "604800" in bad["Failed"]["message"]


def test_flex_start_pool_grows_for_pending_pods_and_shrinks_when_they_go(stack):
    gke, kube = stack
    make_pool(gke, "flex-start")
    cluster(kube, "flex")
    assert ready(kube, "flex")
    assert gke.node_pools()[0]["nodeCount"] == 4
    reasons = {e["reason"] for e in kube.store.list(EVENTS, NS)}
    assert "TriggeredScaleUp" in reasons

    kube.store.delete(RAYCLUSTERS, NS, "flex")
    assert until(lambda: gke.node_pools()[0]["nodeCount"], lambda n: n == 0) == 0


def test_flex_start_without_capacity_leaves_pods_pending_with_the_autoscalers_reason(stack):
    gke, kube = stack
    # The knob over HTTP, as `tpuflow standins up` users would set it.
    request = urllib.request.Request(
        gke.url + "/_standin/capacity",
        data=json.dumps({"flex-start": {"available": False}}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert json.load(response)["flex-start"]["available"] is False
    make_pool(gke, "flex-start")
    cluster(kube, "flex")
    events = until(
        lambda: [e for e in kube.store.list(EVENTS, NS) if e["reason"] == "NotTriggerScaleUp"], lambda found: found
    )
    assert "GCE_STOCKOUT" in events[0]["message"]
    assert gke.node_pools()[0]["nodeCount"] == 0
    assert all(p["status"]["phase"] == "Pending" for p in workers(kube, "flex"))


def test_the_autoscalers_loop_retries_an_api_servers_429_and_records_other_errors() -> None:
    """A 429 ("storage is (re)initializing", a CRD's storage starting) is the API server's retry-later: the loop
    retries it, as client-go does; any other error is the stand-in's own and is recorded."""
    import time

    from tpuflow_rehearsal.nodes.kube_rest import KubeError
    from tpuflow_rehearsal.standins.capacity import CapacityController

    class Pools:
        def __init__(self, error: Exception) -> None:
            self.error = error

        def capacity_settings(self) -> Any:
            raise self.error

    for error, recorded in ((KubeError(429, "storage is (re)initializing"), False), (KubeError(500, "boom"), True)):
        controller = CapacityController(objects=None, pools=Pools(error), interval=0.01).start()  # type: ignore[arg-type]
        time.sleep(0.1)
        controller.stop()
        assert bool(controller.errors) is recorded, controller.errors
