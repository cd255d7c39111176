"""A container's environment as the node agent resolves it: Kubernetes' rules, and the TPU VM's metadata."""

from __future__ import annotations

import json

from tpuflow_rehearsal.nodes.pod_env import container_env, expand, tpu_metadata

POD = {
    "metadata": {"name": "rc-head-x", "namespace": "team", "uid": "u-1", "labels": {"ray.io/cluster": "rc"}},
    "spec": {"nodeName": "gke-c-default-pool-0"},
    "status": {"podIP": "10.200.0.7", "hostIP": "10.200.0.1"},
}


def test_references_expand_as_kubernetes_expands_them() -> None:
    env = {"A": "x", "B": "y"}
    assert expand("$(A)-$(B)-$(C)-$$(A)", env) == "x-y-$(C)-$(A)"


def test_downward_api_secrets_and_order() -> None:
    secrets = {("secrets", "tok", "auth_token"): "s3cret", ("configmaps", "cm", ""): json.dumps({"K": "v"})}
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "MY_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "CLUSTER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}}},
            {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "auth_token"}}},
            {"name": "ADDR", "value": "$(MY_POD_IP):6379"},
            {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
        "resources": {"limits": {"cpu": "1500m"}},
    }
    env = container_env(POD, container, lambda kind, name, key: secrets.get((kind, name, key)), {"PATH": "/bin"})
    assert env["MY_POD_IP"] == "10.200.0.7" and env["ADDR"] == "10.200.0.7:6379"
    assert env["CLUSTER"] == "rc" and env["RAY_AUTH_TOKEN"] == "s3cret" and env["CM_K"] == "v"
    assert env["CPUS"] == "2" and env["PATH"] == "/bin"


def test_a_tpu_vm_tells_ray_its_slice() -> None:
    v6e = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "4x4"}
    assert tpu_metadata(v6e) == {"TPU_ACCELERATOR_TYPE": "v6e-16", "TPU_TOPOLOGY": "4x4"}
    v5p = {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice", "cloud.google.com/gke-tpu-topology": "2x2x2"}
    assert tpu_metadata(v5p)["TPU_ACCELERATOR_TYPE"] == "v5p-16"  # v5p counts TensorCores
    v5e = {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice", "cloud.google.com/gke-tpu-topology": "2x2"}
    assert tpu_metadata(v5e)["TPU_ACCELERATOR_TYPE"] == "v5litepod-4"
    assert tpu_metadata({"cloud.google.com/gke-nodepool": "default-pool"}) == {}
