"""The Kubernetes API stand-in, driven through the real kubernetes and kubernetes_asyncio clients."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tpuflow_rehearsal.standins.kubernetes_api import PODS, RAYCLUSTERS, KubernetesApiStandin

G, V, NS = "ray.io", "v1", "default"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubernetesApiStandin, client.ApiClient, Path]]:
    with KubernetesApiStandin() as standin:
        kubeconfig = standin.write_kubeconfig(tmp_path / "kubeconfig")
        api_client = config.new_client_from_config(config_file=str(kubeconfig))
        yield standin, api_client, kubeconfig
        api_client.close()


def rc(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "headGroupSpec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "ray-head", "image": "x", "ports": [{"containerPort": 8265, "name": "dashboard"}]}
                        ]
                    }
                }
            }
        },
        "status": {"state": "ready"},
    }


def status_of(err: client.ApiException) -> dict[str, Any]:
    return json.loads(err.body)


def test_crud_with_kubernetes_status_errors(api: Any) -> None:
    _, api_client, _ = api
    co = client.CustomObjectsApi(api_client)
    created = co.create_namespaced_custom_object(G, V, NS, "rayclusters", rc("a"))
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["generation"] == 1 and meta["namespace"] == NS
    assert "status" not in created  # status is a subresource: ignored on create
    head = created["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["ports"] == [{"containerPort": 8265, "name": "dashboard", "protocol": "TCP"}]  # CRD defaulting
    with pytest.raises(client.ApiException) as dup:
        co.create_namespaced_custom_object(G, V, NS, "rayclusters", rc("a"))
    assert dup.value.status == 409
    assert status_of(dup.value)["reason"] == "AlreadyExists"
    assert status_of(dup.value)["kind"] == "Status" and status_of(dup.value)["code"] == 409
    co.delete_namespaced_custom_object(G, V, NS, "rayclusters", "a")
    with pytest.raises(client.ApiException) as gone:
        co.get_namespaced_custom_object(G, V, NS, "rayclusters", "a")
    assert gone.value.status == 404
    assert status_of(gone.value)["message"] == 'rayclusters.ray.io "a" not found'


def test_generation_status_subresource_and_optimistic_concurrency(api: Any) -> None:
    _, api_client, _ = api
    co = client.CustomObjectsApi(api_client)
    first = co.create_namespaced_custom_object(G, V, NS, "rayclusters", rc("a"))
    labelled = co.patch_namespaced_custom_object(G, V, NS, "rayclusters", "a", {"metadata": {"labels": {"x": "1"}}})
    assert labelled["metadata"]["generation"] == 1  # metadata changes do not bump generation
    patched = co.patch_namespaced_custom_object(
        G, V, NS, "rayclusters", "a", {"spec": {"rayVersion": "2.60.0"}, "status": {"state": "ignored"}}
    )
    assert patched["metadata"]["generation"] == 2 and "status" not in patched
    with_status = co.patch_namespaced_custom_object_status(
        G, V, NS, "rayclusters", "a", {"status": {"state": "ready"}, "spec": {"x": 1}}
    )
    assert with_status["status"] == {"state": "ready"} and "x" not in with_status["spec"]
    stale = dict(first)
    with pytest.raises(client.ApiException) as conflict:
        co.replace_namespaced_custom_object(G, V, NS, "rayclusters", "a", stale)
    assert conflict.value.status == 409 and status_of(conflict.value)["reason"] == "Conflict"
    current = co.get_namespaced_custom_object(G, V, NS, "rayclusters", "a")
    current["spec"]["rayVersion"] = "2.61.0"
    replaced = co.replace_namespaced_custom_object(G, V, NS, "rayclusters", "a", current)
    assert replaced["metadata"]["generation"] == 3 and replaced["status"] == {"state": "ready"}


def test_list_with_label_selectors(api: Any) -> None:
    _, api_client, _ = api
    co = client.CustomObjectsApi(api_client)
    co.create_namespaced_custom_object(G, V, NS, "rayclusters", rc("a", team="ml", tier="gpu"))
    co.create_namespaced_custom_object(G, V, NS, "rayclusters", rc("b", team="ml", tier="tpu"))
    co.create_namespaced_custom_object(G, V, "other", "rayclusters", rc("c", team="web"))

    def names(**kw: Any) -> list[str]:
        return [o["metadata"]["name"] for o in co.list_namespaced_custom_object(G, V, NS, "rayclusters", **kw)["items"]]

    assert names() == ["a", "b"]
    assert names(label_selector="team=ml,tier!=gpu") == ["b"]
    assert names(label_selector="tier in (gpu,cpu)") == ["a"]
    assert names(label_selector="!tier") == []
    everywhere = co.list_cluster_custom_object(G, V, "rayclusters")["items"]
    assert sorted(o["metadata"]["name"] for o in everywhere) == ["a", "b", "c"]


def test_pods_logs_and_events_through_core_v1(api: Any) -> None:
    standin, api_client, _ = api
    core = client.CoreV1Api(api_client)
    store = standin.store
    pod = {
        "metadata": {"name": "head", "labels": {"ray.io/cluster": "a"}},
        "spec": {"containers": [{"name": "ray-head", "image": "x"}]},
        "status": {"phase": "Pending"},
    }
    store.create(PODS, NS, pod)
    with pytest.raises(client.ApiException) as waiting:
        core.read_namespaced_pod_log("head", NS)
    assert waiting.value.status == 400 and "waiting to start" in status_of(waiting.value)["message"]
    store.mutate(PODS, NS, "head", lambda p: p["status"].update(phase="Running"))
    store.append_log(NS, "head", [f"line {i}" for i in range(10)])
    raw = core.read_namespaced_pod_log("head", NS, tail_lines=3, _preload_content=False).data.decode()
    assert raw.splitlines() == ["line 7", "line 8", "line 9"]
    assert [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="ray.io/cluster=a").items] == ["head"]
    store.record_event(NS, {"kind": "Pod", "name": "head", "namespace": NS}, "Warning", "FailedScheduling", "0/1")
    store.record_event(NS, {"kind": "Pod", "name": "head", "namespace": NS}, "Warning", "FailedScheduling", "0/1")
    store.record_event(NS, {"kind": "Pod", "name": "other", "namespace": NS}, "Normal", "Pulled", "ok")
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=head").items
    assert [(e.reason, e.count) for e in events] == [("FailedScheduling", 2)]


def test_discovery_and_auth(api: Any, tmp_path: Path) -> None:
    standin, api_client, _ = api
    assert client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    groups = client.ApisApi(api_client).get_api_versions().groups
    assert [g.name for g in groups] == ["ray.io", "autoscaling.x-k8s.io"]  # KubeRay, GKE's ProvisioningRequest
    resources = client.CustomObjectsApi(api_client).get_api_resources("autoscaling.x-k8s.io", "v1").resources
    assert [(r.name, r.kind) for r in resources][0] == ("provisioningrequests", "ProvisioningRequest")
    assert client.VersionApi(api_client).get_code().git_version.startswith("v1.")
    assert standin.url.startswith("https://127.0.0.1:")  # kubectl sends a bearer token only over TLS
    anonymous = client.Configuration(host=standin.url)
    anonymous.ssl_ca_cert = str(standin.write_ca(tmp_path / "ca.pem"))
    unauthenticated = client.ApiClient(anonymous)
    with pytest.raises(client.ApiException) as denied:
        client.CoreV1Api(unauthenticated).list_namespaced_pod(NS)
    assert denied.value.status == 401


def test_finalizers_and_owner_garbage_collection(api: Any) -> None:
    standin, api_client, _ = api
    co = client.CustomObjectsApi(api_client)
    owner = co.create_namespaced_custom_object(G, V, NS, "rayclusters", rc("a"))
    standin.store.mutate(RAYCLUSTERS, NS, "a", lambda o: o["metadata"].update(finalizers=["test/hold"]))
    ref = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "a", "uid": owner["metadata"]["uid"]}
    standin.store.create(
        PODS,
        NS,
        {"metadata": {"name": "p", "ownerReferences": [ref]}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    deleting = co.delete_namespaced_custom_object(G, V, NS, "rayclusters", "a")
    assert deleting["metadata"]["deletionTimestamp"]
    assert co.get_namespaced_custom_object(G, V, NS, "rayclusters", "a")  # held by the finalizer
    co.patch_namespaced_custom_object(G, V, NS, "rayclusters", "a", {"metadata": {"finalizers": None}})
    with pytest.raises(client.ApiException):
        co.get_namespaced_custom_object(G, V, NS, "rayclusters", "a")
    assert client.CoreV1Api(api_client).list_namespaced_pod(NS).items == []  # dependents collected


def test_dry_run_create_is_not_persisted(api: Any) -> None:
    _, api_client, _ = api
    co = client.CustomObjectsApi(api_client)
    assert (
        co.create_namespaced_custom_object(G, V, NS, "rayclusters", rc("a"), dry_run="All")["metadata"]["name"] == "a"
    )
    assert co.list_namespaced_custom_object(G, V, NS, "rayclusters")["items"] == []


def test_the_async_client_reads_the_same_objects(api: Any) -> None:
    from kubernetes_asyncio import client as aclient
    from kubernetes_asyncio import config as aconfig

    _, api_client, kubeconfig = api
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(G, V, NS, "rayclusters", rc("a"))

    async def read() -> dict[str, Any]:
        async with await aconfig.new_client_from_config(config_file=str(kubeconfig)) as async_client:
            return await aclient.CustomObjectsApi(async_client).get_namespaced_custom_object(
                G, V, NS, "rayclusters", "a"
            )

    assert asyncio.run(read())["metadata"]["name"] == "a"
