"""GKE's capacity machinery on the real control plane: the ProvisioningRequest CRD as GKE serves it, and the
played cluster autoscaler (tpuflow_rehearsal.standins.capacity's rules: queued provisioning and flex-start) talking to
the real API server as its own user, with the permissions GKE's autoscaler has on these objects. It resizes the
GKE stand-in's queued and flex-start pools; the node agent then registers (or removes) their Nodes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from tpuflow_rehearsal.nodes.kube_rest import KubeError, KubeRest
from tpuflow_rehearsal.standins.capacity import CapacityController
from tpuflow_rehearsal.standins.capacity_objects import RestObjects
from tpuflow_rehearsal.standins.kuberay_controller.seams import GkeNodePools

AUTOSCALER_USER = "cluster-autoscaler"
CRD_PATH = Path(__file__).resolve().parent / "controlplane" / "crds" / "autoscaling.x-k8s.io_provisioningrequests.yaml"
# What the autoscaler reads and writes for queued provisioning and flex-start, and nothing else: it never
# creates or deletes requests, pods or templates (the DAG's tasks do), it reports on them.
AUTOSCALER_ROLE: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "tpuflow:cluster-autoscaler-capacity"},
    "rules": [
        {
            "apiGroups": ["autoscaling.x-k8s.io"],
            "resources": ["provisioningrequests"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["autoscaling.x-k8s.io"],
            "resources": ["provisioningrequests/status"],
            "verbs": ["get", "update", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods", "podtemplates"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ],
}
ROLES = (AUTOSCALER_ROLE["metadata"]["name"],)  # bound to AUTOSCALER_USER (ControlPlane's extra_users)


def _create(api: KubeRest, path: str, body: dict[str, Any]) -> None:
    try:
        api.request("POST", path, body)
    except KubeError as err:
        if err.status != 409:
            raise


def install(admin: KubeRest, *, timeout: float = 60.0) -> None:
    """The autoscaler's ClusterRole and the ProvisioningRequest CRD, waiting until the API serves it."""
    _create(admin, "/apis/rbac.authorization.k8s.io/v1/clusterroles", AUTOSCALER_ROLE)
    crd = yaml.safe_load(CRD_PATH.read_text())
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    _create(admin, path, crd)
    deadline = time.monotonic() + timeout
    while True:
        status = admin.request("GET", f"{path}/{crd['metadata']['name']}").get("status") or {}
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in status.get("conditions") or []):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the CRD {crd['metadata']['name']} was not established after {timeout:.0f}s")
        time.sleep(0.2)


def start_autoscaler(api: KubeRest, gke: Any, cluster: str, *, interval: float = 0.5) -> CapacityController:
    """The played autoscaler over the real API (``api``: AUTOSCALER_USER's) and the GKE stand-in's pools."""
    return CapacityController(RestObjects(api), GkeNodePools(gke, cluster=cluster), interval=interval).start()
