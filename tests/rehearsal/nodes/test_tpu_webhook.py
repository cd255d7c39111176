"""GKE's TPU webhook as the node agent serves it: the add-on's validation rule and pod mutation, and the
AdmissionReview exchange over TLS the real kube-apiserver makes."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from typing import Any

import pytest

from tpuflow_rehearsal.controlplane.pki import CertificateAuthority
from tpuflow_rehearsal.nodes.tpu_webhook import (
    DENIAL,
    TpuWebhookServer,
    WebhookFailure,
    headless_service,
    mutate_pod,
    validate_raycluster,
)


def group(topology: str, chips: int, hosts: int, name: str = "tpu-group") -> dict[str, Any]:
    return {
        "groupName": name,
        "numOfHosts": hosts,
        "template": {
            "spec": {
                "nodeSelector": {
                    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                    "cloud.google.com/gke-tpu-topology": topology,
                },
                "containers": [{"name": "ray-worker", "resources": {"limits": {"google.com/tpu": str(chips)}}}],
            }
        },
    }


def cluster(*groups: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "RayCluster", "metadata": {"name": "rc"}, "spec": {"workerGroupSpecs": list(groups)}}


@pytest.mark.parametrize(
    ("topology", "chips", "hosts", "admitted"),
    [("4x4", 4, 4, True), ("4x4", 4, 16, False), ("2x4", 8, 1, True), ("2x4", 4, 2, True), ("2x4", 4, 1, False)],
)
def test_num_of_hosts_must_match_the_topology(topology: str, chips: int, hosts: int, admitted: bool) -> None:
    assert validate_raycluster(cluster(group(topology, chips, hosts))) == (None if admitted else DENIAL)


def test_cpu_groups_are_not_judged_and_broken_tpu_groups_fail_the_call() -> None:
    cpu = {"groupName": "cpu", "numOfHosts": 7, "template": {"spec": {"containers": [{"name": "w"}]}}}
    assert validate_raycluster(cluster(cpu)) is None
    no_topology = group("4x4", 4, 4)
    del no_topology["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    with pytest.raises(WebhookFailure, match="topology"):
        validate_raycluster(cluster(no_topology))


def worker_pod(name: str, labels: dict[str, str] | None = None, topology: str = "2x4") -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"ray.io/cluster": "rc", "ray.io/group": "tpu-group", **(labels or {})},
        },
        "spec": {
            "nodeSelector": {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": topology,
            },
            "containers": [{"name": "ray-worker", "resources": {"limits": {"google.com/tpu": "4"}}}],
        },
    }


def apply(pod: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSON patch of the shapes the webhook emits (add to a map key, a list end, or a new list)."""
    out = json.loads(json.dumps(pod))
    for op in patch:
        *parents, last = op["path"].strip("/").split("/")
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if last == "-":
            node.append(op["value"])
        elif isinstance(node, list):
            node.insert(int(last), op["value"])
        else:
            node[last] = op["value"]
    return out


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_a_multi_host_slice_gets_distinct_hosts_names_and_one_node_pool() -> None:
    admitted: list[dict[str, Any]] = []
    for i in range(4):  # a 2x4 of 4-chip VMs is 2 hosts: two slices' worth of pods
        pod = apply(worker_pod(f"w{i}"), mutate_pod(worker_pod(f"w{i}"), lambda *_: admitted))
        admitted.append(pod)
    ids = [(p["metadata"]["labels"]["replicaIndex"], env_of(p)["TPU_WORKER_ID"]) for p in admitted]
    assert ids == [("tpu-group-0", "0"), ("tpu-group-0", "1"), ("tpu-group-1", "0"), ("tpu-group-1", "1")]
    first = admitted[0]
    assert first["spec"]["hostname"] == "tpu-group-0-0"
    assert first["spec"]["subdomain"] == "rc-headless" == headless_service("rc")
    env = env_of(first)
    assert env["TPU_WORKER_HOSTNAMES"] == "tpu-group-0-0.rc-headless,tpu-group-0-1.rc-headless"
    assert env["TPU_NAME"] == "tpu-group-0"
    assert env["TPU_DEVICE_PLUGIN_HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    affinity = first["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert affinity["topologyKey"] == "cloud.google.com/gke-nodepool"


def test_kuberay_indexing_labels_win_and_a_deleted_pod_frees_its_host() -> None:
    labelled = worker_pod("w", {"ray.io/worker-group-replica-index": "3", "ray.io/replica-host-index": "1"})
    pod = apply(labelled, mutate_pod(labelled, lambda *_: []))
    assert env_of(pod)["TPU_WORKER_ID"] == "1" and env_of(pod)["TPU_NAME"] == "tpu-group-3"
    assert "replicaIndex" not in pod["metadata"]["labels"]
    first = apply(worker_pod("a"), mutate_pod(worker_pod("a"), lambda *_: []))
    first["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    again = apply(worker_pod("b"), mutate_pod(worker_pod("b"), lambda *_: [first]))
    assert env_of(again)["TPU_WORKER_ID"] == "0"


def test_single_host_pods_get_ids_but_no_hostname() -> None:
    pod = worker_pod("s", topology="2x2")
    out = apply(pod, mutate_pod(pod, lambda *_: []))
    assert "hostname" not in out["spec"] and "TPU_WORKER_HOSTNAMES" not in env_of(out)
    assert env_of(out)["TPU_WORKER_ID"] == "0"
    assert (
        mutate_pod({"kind": "Pod", "metadata": {"name": "cpu"}, "spec": {"containers": [{"name": "c"}]}}, lambda *_: [])
        == []
    )


def test_the_server_answers_admission_reviews_over_tls() -> None:
    ca = CertificateAuthority.generate()
    cert, key = ca.serving_pair("webhook", ["127.0.0.1"])
    server = TpuWebhookServer(cert, key, lambda *_: []).start()
    try:
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())

        def review(path: str, obj: dict[str, Any]) -> tuple[int, dict[str, Any] | str]:
            body = json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"uid": "u1", "object": obj},
                }
            )
            req = urllib.request.Request(f"{server.url}{path}", data=body.encode(), method="POST")
            try:
                with urllib.request.urlopen(req, context=context, timeout=5) as resp:
                    return resp.status, json.loads(resp.read())["response"]
            except urllib.error.HTTPError as err:
                return err.code, err.read().decode()

        status, response = review("/validate", cluster(group("4x4", 4, 2)))
        assert status == 200 and isinstance(response, dict)
        assert response["allowed"] is False and response["status"]["message"] == DENIAL and response["uid"] == "u1"
        status, response = review("/mutate", worker_pod("w"))
        assert status == 200 and isinstance(response, dict) and response["patchType"] == "JSONPatch"
        assert any(op["path"] == "/spec/hostname" for op in json.loads(base64.b64decode(response["patch"])))
        status, text = review("/validate", {"kind": "Pod"})
        assert status == 403 and "Invalid Kind" in str(text)
        mutating, validating = server.configurations(ca.cert_pem)
        assert mutating["webhooks"][0]["clientConfig"]["url"] == f"{server.url}/mutate"
        assert validating["webhooks"][0]["rules"][0]["resources"] == ["rayclusters"]
    finally:
        server.stop()
