"""The shared wait loop (triggers and non-deferrable path) and the XCom address payload."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kubernetes.client import ApiException
from kubernetes_asyncio.client import ApiException as AsyncApiException
from support.kuberay_readers import READY, WAITING, NothingToExplain

from tpuflow.errors import UserInputError
from tpuflow.kuberay.addresses import cluster_payload, service_payload
from tpuflow.kuberay.waits import wait_gone, wait_ready


class ScriptedReader(NothingToExplain):
    """Returns the scripted objects in turn (the last one repeats); errors are raised."""

    def __init__(self, *objects: Any) -> None:
        self.objects = list(objects)
        self.calls = 0

    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        item = self.objects[min(self.calls, len(self.objects) - 1)]
        self.calls += 1
        if isinstance(item, Exception):
            raise item
        return item  # type: ignore[no-any-return]


def wait(reader: ScriptedReader, timeout: float = 2.0) -> dict[str, Any]:
    return asyncio.run(
        wait_ready(
            reader, kind="RayCluster", name="rc", namespace="ns", deadline=time.time() + timeout, poll_interval=0.01
        )
    )


def wait_deleted(reader: ScriptedReader, timeout: float, poll_interval: float) -> dict[str, Any]:
    """wait_gone on the RayCluster rc in ns."""
    deadline = time.time() + timeout
    return asyncio.run(
        wait_gone(reader, kind="RayCluster", name="rc", namespace="ns", deadline=deadline, poll_interval=poll_interval)
    )


def test_transient_api_errors_are_retried_until_ready() -> None:
    # The clients' own exceptions: kubernetes (worker) and kubernetes_asyncio (triggerer), and a dropped socket.
    reader = ScriptedReader(
        ApiException(status=503, reason="ServiceUnavailable"),
        ConnectionResetError("reset"),
        AsyncApiException(status=429, reason="TooManyRequests"),
        WAITING,
        READY,
    )
    event = wait(reader)
    assert event["status"] == "success" and reader.calls == 5
    assert (event["kind"], event["name"], event["namespace"]) == ("RayCluster", "rc", "ns")


def test_permission_errors_end_the_wait_at_once() -> None:
    event = wait(ScriptedReader(AsyncApiException(status=403, reason="Forbidden: rayclusters.ray.io is forbidden")))
    assert event["status"] == "error" and "forbidden" in event["message"]


def test_an_unexpected_error_is_not_retried() -> None:
    reader = ScriptedReader(ValueError("bad answer"), READY)
    event = wait(reader)
    assert event["status"] == "error" and "ValueError" in event["message"] and reader.calls == 1


def test_an_object_deleted_while_waiting_fails() -> None:
    event = wait(ScriptedReader(WAITING, None))
    assert event["status"] == "failed" and "no longer exists" in event["message"]
    assert event["retryable"] is True  # a retry creates it again


def test_a_failure_kubernetes_reports_is_not_retryable() -> None:
    failing = {
        "metadata": {"name": "rc"},
        "status": {
            "conditions": [
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateWorkerPod", "message": "quota"}
            ]
        },
    }
    event = wait(ScriptedReader(failing))
    assert event["status"] == "failed" and event["retryable"] is False and "quota" in event["message"]


def test_delete_wait_succeeds_once_gone() -> None:
    event = wait_deleted(ScriptedReader(READY, None), timeout=2, poll_interval=0.01)
    assert event["status"] == "success" and "is gone" in event["message"]


def test_delete_wait_reports_a_stuck_finalizer() -> None:
    held = {"metadata": {"name": "rc", "deletionTimestamp": "2026-11-29T00:00:00Z", "finalizers": ["ray.io/gcs-ft"]}}
    event = wait_deleted(ScriptedReader(held), timeout=0.2, poll_interval=0.05)
    assert event["status"] == "timeout" and "ray.io/gcs-ft" in event["message"]
    assert "finalizer is stuck" in event["message"]


def test_delete_wait_says_the_pods_are_still_terminating_under_foreground_deletion() -> None:
    """tpuflow deletes with foreground propagation: the object stays until the garbage collector removed its pods,
    so a deadline met then is about the pods (their node gone or unreachable), not a finalizer of KubeRay's."""
    held = {
        "metadata": {"name": "rc", "deletionTimestamp": "2026-12-07T00:00:00Z", "finalizers": ["foregroundDeletion"]}
    }
    event = wait_deleted(ScriptedReader(held), timeout=0.2, poll_interval=0.05)
    assert event["status"] == "timeout" and "its pods are still terminating" in event["message"], event


class ServiceDependents(NothingToExplain):
    """A RayService already gone (deleted in the background), and what KubeRay made for it, in turn: the RayClusters
    listed by KubeRay's labels and the pods of the named clusters (the last of each repeats)."""

    def __init__(self, clusters: list[list[str]], pods: list[list[str]]) -> None:
        self.clusters, self.pods_left = clusters, pods
        self.selectors: list[str] = []

    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        return None

    async def objects(self, plural: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        assert plural == "rayclusters"
        self.selectors.append(label_selector)
        names = self.clusters.pop(0) if len(self.clusters) > 1 else self.clusters[0]
        return [{"metadata": {"name": n}} for n in names]

    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self.selectors.append(label_selector)
        names = self.pods_left.pop(0) if len(self.pods_left) > 1 else self.pods_left[0]
        return [{"metadata": {"name": n}} for n in names]


def wait_service_deleted(reader: ServiceDependents, timeout: float, clusters: list[str]) -> dict[str, Any]:
    return asyncio.run(
        wait_gone(
            reader,
            kind="RayService",
            name="svc",
            namespace="ns",
            deadline=time.time() + timeout,
            poll_interval=0.01,
            clusters=clusters,
        )
    )


def test_a_rayservices_delete_waits_for_its_rayclusters_and_their_pods() -> None:
    """KubeRay makes a RayService's RayClusters under its own labels; deleted in the background, the RayService is gone
    at once and the garbage collector takes its clusters and then their pods: the wait ends only when no cluster made
    for it (one read before the delete, one made during it) has a pod left."""
    reader = ServiceDependents(
        clusters=[["svc-made-during"], []],
        pods=[["svc-abcde-head", "svc-made-during-head"], ["svc-made-during-head"], []],
    )
    event = wait_service_deleted(reader, timeout=2, clusters=["svc-abcde"])
    assert event["status"] == "success", event
    assert reader.selectors[0] == "ray.io/originated-from-crd=RayService,ray.io/originated-from-cr-name=svc"
    assert "ray.io/cluster in (svc-abcde,svc-made-during)" in reader.selectors


def test_a_rayservices_delete_names_the_pods_left_at_its_deadline() -> None:
    reader = ServiceDependents(clusters=[[]], pods=[["svc-abcde-worker-0"]])
    event = wait_service_deleted(reader, timeout=0.2, clusters=["svc-abcde"])
    assert event["status"] == "timeout", event
    assert "RayService ns/svc is gone, but what KubeRay made for it is not" in event["message"]
    assert "pod svc-abcde-worker-0" in event["message"]


CLUSTER = {
    "metadata": {"name": "rc", "namespace": "ml"},
    "spec": {
        "headGroupSpec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "ray-head",
                            "ports": [
                                {"name": "gcs", "containerPort": 6379},
                                {"name": "dashboard", "containerPort": 8265},
                                {"name": "client", "containerPort": 10001},
                                {"name": "serve", "containerPort": 8000},
                            ],
                        }
                    ]
                }
            }
        }
    },
    "status": {
        "head": {"serviceName": "rc-head-svc", "serviceIP": "10.0.0.7", "podName": "rc-head-x"},
        "endpoints": {"gcs": "6379", "dashboard": "8265", "client": "10001", "serve": "8000"},
    },
}


def test_address_modes() -> None:
    outside = cluster_payload(CLUSTER, None, mode="auto", in_cluster=False)
    assert outside["dashboard_url"] == "http://10.0.0.7:8265" and outside["address_mode"] == "head_service"
    inside = cluster_payload(CLUSTER, None, mode="auto", in_cluster=True)
    assert inside["dashboard_url"] == "http://rc-head-svc.ml.svc.cluster.local:8265"
    assert inside["client_address"] == "ray://rc-head-svc.ml.svc.cluster.local:10001"
    assert inside["gcs_address"] == "rc-head-svc.ml.svc.cluster.local:6379"
    forwarded = cluster_payload(CLUSTER, None, mode="port_forward", in_cluster=False)
    assert forwarded["serve_url"] == "http://127.0.0.1:8000"
    lb = {"spec": {"clusterIP": "10.0.0.7", "ports": []}, "status": {"loadBalancer": {"ingress": [{"ip": "34.1.2.3"}]}}}
    assert (
        cluster_payload(CLUSTER, lb, mode="head_service", in_cluster=False)["dashboard_url"] == "http://34.1.2.3:8265"
    )
    with pytest.raises(UserInputError):
        cluster_payload(CLUSTER, None, mode="nodeport", in_cluster=False)


def test_service_payload_prefers_the_serve_service() -> None:
    svc = {
        "metadata": {"name": "llm", "namespace": "ml"},
        "status": {
            "activeServiceStatus": {"rayClusterName": "rc", "applicationStatuses": {"llm": {"status": "RUNNING"}}}
        },
    }
    cluster = cluster_payload(CLUSTER, None, mode="auto", in_cluster=True)
    payload = service_payload(svc, cluster, None, mode="auto", in_cluster=True)
    assert payload["serve_url"] == "http://llm-serve-svc.ml.svc.cluster.local:8000"
    assert payload["applications"] == {"llm": "RUNNING"} and payload["ray_cluster_name"] == "rc"
