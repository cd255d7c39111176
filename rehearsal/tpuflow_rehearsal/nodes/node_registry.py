"""The GKE nodes the node agent registers with the real API server: one Node per node of every RUNNING pool the
GKE stand-in holds for the played cluster, plus the cluster's default (CPU) pool, with what GKE's kubelets report.

A node carries the pool's node labels as the GKE stand-in computes them (``cloud.google.com/gke-nodepool``,
``cloud.google.com/gke-tpu-accelerator``, ``cloud.google.com/gke-tpu-topology``, instance type, zone, spot /
flex-start / reservation), ``kubernetes.io/hostname``, capacity (CPU and memory of the machine type,
``google.com/tpu`` = the VM's chips) and, on TPU nodes, GKE's taint ``google.com/tpu=present:NoSchedule`` (pods
that request ``google.com/tpu`` tolerate it through kube-apiserver's ExtendedResourceToleration admission, as
on GKE). Heartbeats: the node's Lease in ``kube-node-lease`` and its Ready condition, as a kubelet renews them;
the real node lifecycle controller marks a node whose agent died NotReady and evicts its pods.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuflow_rehearsal.nodes.kube_rest import KubeError, KubeRest

MANAGED_LABEL = "tpuflow.dev/node-agent"  # nodes this agent registered (value: the agent's network index)
TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
KUBELET_VERSION = "v1.36.3"
LEASE_NAMESPACE = "kube-node-lease"
DEFAULT_POOL = "default-pool"
_CHIPS = re.compile(r"-(\d+)t$")
# CPUs and memory (GiB) of the machine types the rehearsal meets; others get 8 / 32
_MACHINES = {
    "e2-standard-8": (8, 32),
    "ct6e-standard-1t": (44, 176),
    "ct6e-standard-4t": (180, 720),
    "ct6e-standard-8t": (180, 1440),
    "ct5lp-hightpu-1t": (24, 48),
    "ct5lp-hightpu-4t": (112, 192),
    "ct5lp-hightpu-8t": (224, 384),
    "ct5p-hightpu-4t": (208, 448),
    "ct4p-hightpu-4t": (240, 407),
    "tpu7x-standard-4t": (224, 960),
}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    pool: str
    labels: dict[str, str]
    machine_type: str
    tpu_chips: int
    taints: tuple[tuple[str, str, str], ...] = ()

    def body(self, index: int, address: str) -> dict[str, Any]:
        cpus, memory = _MACHINES.get(self.machine_type, (8, 32))
        capacity = {"cpu": str(cpus), "memory": f"{memory}Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        if self.tpu_chips:
            capacity["google.com/tpu"] = str(self.tpu_chips)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    **self.labels,
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    MANAGED_LABEL: str(index),
                },
            },
            "spec": {"taints": [{"key": k, "value": v, "effect": e} for k, v, e in self.taints]},
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": self.name}],
                "conditions": ready_conditions(),
                "nodeInfo": {
                    "kubeletVersion": KUBELET_VERSION,
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "tpuflow://node-agent",
                    "osImage": "Container-Optimized OS (played by tpuflow's node agent)",
                    "kernelVersion": "",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            },
        }


def ready_conditions() -> list[dict[str, str]]:
    stamp = now()
    healthy = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    return [
        {"type": t, "status": s, "reason": r, "message": r, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
        for t, s, r in healthy
    ]


def wanted_nodes(cluster: str, pools: Iterable[Mapping[str, Any]], default_nodes: int = 1) -> list[NodeSpec]:
    """The nodes the played cluster has now: its default pool's and every RUNNING pool's."""
    short = cluster.rsplit("/", 1)[-1]
    out = [
        NodeSpec(
            name=f"gke-{short}-{DEFAULT_POOL}-{i}",
            pool=DEFAULT_POOL,
            labels={"cloud.google.com/gke-nodepool": DEFAULT_POOL, "node.kubernetes.io/instance-type": "e2-standard-8"},
            machine_type="e2-standard-8",
            tpu_chips=0,
        )
        for i in range(default_nodes)
    ]
    for pool in pools:
        if pool.get("status") != "RUNNING" or (pool.get("cluster") and pool.get("cluster") != cluster):
            continue
        machine = str((pool.get("config") or {}).get("machineType", ""))
        labels = {str(k): str(v) for k, v in (pool.get("nodeLabels") or {}).items()}
        chips_match = _CHIPS.search(machine) if "cloud.google.com/gke-tpu-accelerator" in labels else None
        chips = int(chips_match.group(1)) if chips_match else 0
        taints = tuple(
            (str(t.get("key")), str(t.get("value", "")), str(t.get("effect", "NoSchedule")))
            for t in (pool.get("config") or {}).get("taints") or []
        )
        if chips:
            taints = (*taints, (TPU_TAINT["key"], TPU_TAINT["value"], TPU_TAINT["effect"]))
        for i in range(int(pool.get("nodeCount") or 0)):
            out.append(
                NodeSpec(
                    name=f"gke-{short}-{pool['name']}-{i}",
                    pool=str(pool["name"]),
                    labels=labels,
                    machine_type=machine,
                    tpu_chips=chips,
                    taints=taints,
                )
            )
    return out


@dataclass
class NodeRegistry:
    """Registers and removes this agent's Nodes, and renews their heartbeats."""

    api: KubeRest
    index: int
    address: str
    known: dict[str, NodeSpec] = field(default_factory=dict)

    def sync(self, wanted: Iterable[NodeSpec]) -> tuple[list[str], list[str]]:
        """Create missing nodes, delete gone ones (the pool was deleted or shrank); (added, removed)."""
        want = {n.name: n for n in wanted}
        existing = {
            n["metadata"]["name"]
            for n in self.api.items("/api/v1/nodes", labelSelector=f"{MANAGED_LABEL}={self.index}")
        }
        added, removed = [], []
        for name, spec in want.items():
            if name not in existing:
                try:
                    self.api.request("POST", "/api/v1/nodes", spec.body(self.index, self.address))
                except KubeError as err:
                    if err.status != 409:
                        raise
                added.append(name)
            self.known[name] = spec
        for name in existing - set(want):
            try:
                self.api.request("DELETE", f"/api/v1/nodes/{name}")
            except KubeError as err:
                if err.status != 404:
                    raise
            self.known.pop(name, None)
            self._delete_lease(name)
            removed.append(name)
        return added, removed

    def heartbeat(self) -> None:
        for name in list(self.known):
            try:
                self.api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": ready_conditions()}})
                self._renew_lease(name)
            except KubeError as err:
                if err.status != 404:
                    raise

    def _renew_lease(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
        try:
            self.api.merge_patch(path, {"spec": spec})
        except KubeError as err:
            if err.status != 404:
                raise
            self.api.request(
                "POST",
                f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases",
                {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": spec},
            )

    def _delete_lease(self, name: str) -> None:
        try:
            self.api.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}")
        except KubeError as err:
            if err.status != 404:
                raise

    def remove_all(self) -> None:
        self.sync([])
