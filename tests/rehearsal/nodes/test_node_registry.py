"""Which Nodes the node agent registers for the GKE stand-in's pools, and what GKE's kubelets say of them."""

from __future__ import annotations

from tpuflow_rehearsal.nodes.node_registry import MANAGED_LABEL, wanted_nodes

CLUSTER = "projects/p/locations/us-east5-b/clusters/c"


def pool(name: str, status: str = "RUNNING", nodes: int = 2, machine: str = "ct6e-standard-4t") -> dict[str, object]:
    return {
        "name": name,
        "cluster": CLUSTER,
        "status": status,
        "nodeCount": nodes,
        "config": {"machineType": machine},
        "nodeLabels": {
            "cloud.google.com/gke-nodepool": name,
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "2x4",
        },
    }


def test_running_pools_give_tpu_nodes_with_gke_labels_capacity_and_taint() -> None:
    nodes = wanted_nodes(
        CLUSTER, [pool("slice"), pool("making", status="PROVISIONING"), {**pool("other"), "cluster": "x"}]
    )
    names = [n.name for n in nodes]
    assert names == ["gke-c-default-pool-0", "gke-c-slice-0", "gke-c-slice-1"]
    body = nodes[1].body(3, "10.203.0.1")
    assert body["status"]["capacity"]["google.com/tpu"] == "4"
    assert body["spec"]["taints"] == [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
    labels = body["metadata"]["labels"]
    assert labels["cloud.google.com/gke-tpu-topology"] == "2x4" and labels["kubernetes.io/hostname"] == "gke-c-slice-0"
    assert labels[MANAGED_LABEL] == "3"
    head = nodes[0].body(3, "10.203.0.1")
    assert "google.com/tpu" not in head["status"]["capacity"] and head["spec"]["taints"] == []
    assert [c["type"] for c in head["status"]["conditions"] if c["status"] == "True"] == ["Ready"]
