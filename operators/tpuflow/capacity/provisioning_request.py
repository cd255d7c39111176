"""GKE queued provisioning for a TPU slice: the PodTemplate(s) and ProvisioningRequest, and what their status says.

Pure module (no Kubernetes client). On GKE, nodes of a pool created with queued provisioning
(``--flex-start --enable-queued-provisioning``; capacity ``queued`` in tpuflow.gke.nodepool_spec)
only arrive through a ``ProvisioningRequest`` (``autoscaling.x-k8s.io/v1``, class
``queued-provisioning.gke.io``) whose pod sets reference core/v1 PodTemplates shaped like the pods
that will consume the nodes. The pods consume them by the annotations in ``consume_annotations``.
Everything (node selector, google.com/tpu requests, pod counts) derives from the one slice
definition, TpuSlice: one pod set per slice, one pod per host, each on its own pool.

Status (the cluster autoscaler's conditions): ``Accepted``, ``Provisioned`` (True: the nodes are
there; False with reason ``CapacityIsNotFound`` while GKE keeps looking), ``Failed``,
``CapacityRevoked`` (e.g. maxRunDurationSeconds passed) and ``BookingExpired`` (the nodes were not
used in time): the last three are final.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuflow.errors import UserInputError
from tpuflow.gke.nodepool_spec import FLEX_MAX_RUN_DURATION_S
from tpuflow.kubernetes.values import check_name, check_namespace
from tpuflow.labels import check_labels
from tpuflow.naming import TaskIdentity, check_node_pool_name, dns_name
from tpuflow.tpu import TpuSlice
from tpuflow.validation import check_whole_seconds

API_VERSION = "autoscaling.x-k8s.io/v1"
GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
QUEUED_CLASS = "queued-provisioning.gke.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
# GKE: flex-start (queued provisioning included) runs VMs for at most seven days, also the default
# when maxRunDurationSeconds is not given.
MAX_RUN_DURATION_SECONDS = FLEX_MAX_RUN_DURATION_S
FINAL_CONDITIONS = ("Failed", "CapacityRevoked", "BookingExpired")
NAME_MAX = 63
_TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def consume_annotations(request_name: str) -> dict[str, str]:
    """The annotations that make pods land on (only) the nodes of this ProvisioningRequest."""
    return {CONSUME_ANNOTATION: request_name, CLASS_ANNOTATION: QUEUED_CLASS}


def check_max_run_duration(value: object) -> int | None:
    """maxRunDurationSeconds: whole seconds, 1 to 604800 (seven days, GKE's limit); None/empty: GKE's default."""
    return check_whole_seconds(
        "max_run_duration_seconds",
        value,
        maximum=MAX_RUN_DURATION_SECONDS,
        fix=f"give whole seconds from 1 to {MAX_RUN_DURATION_SECONDS} (GKE runs flex-start and queued nodes at "
        "most seven days), or leave it empty for GKE's default of seven days",
    )


def request_name(identity: TaskIdentity) -> str:
    """The ProvisioningRequest's name for one task instance: the same on every try."""
    return dns_name(identity.task_id, key=identity.key, max_len=NAME_MAX)


@dataclass(frozen=True)
class ProvisioningRequestPlan:
    """The PodTemplates (one per slice and pool) and the ProvisioningRequest asking for all their nodes."""

    name: str
    namespace: str
    tpu: TpuSlice
    node_pools: tuple[str, ...]
    max_run_duration_seconds: int | None = None
    labels: Mapping[str, str] | None = None

    @property
    def template_names(self) -> tuple[str, ...]:
        if len(self.node_pools) == 1:
            return (self.name,)
        return tuple(f"{self.name[: NAME_MAX - 4].rstrip('-')}-s{i}" for i in range(len(self.node_pools)))

    @property
    def hosts_per_pool(self) -> int:
        return self.tpu.num_hosts if self.tpu.multi_host else self.tpu.total_hosts

    def _meta(self, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if self.labels:
            meta["labels"] = dict(self.labels)
        return meta

    def pod_template(self, index: int) -> dict[str, Any]:
        """A core/v1 PodTemplate like the TPU worker pods: same selector and google.com/tpu requests, one pool."""
        requests = dict(self.tpu.tpu_resource_request)
        return {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": self._meta(self.template_names[index]),
            "template": {
                "spec": {
                    "nodeSelector": {**self.tpu.node_selector, NODE_POOL_LABEL: self.node_pools[index]},
                    "tolerations": [dict(_TPU_TOLERATION)],
                    "containers": [
                        {
                            "name": "tpu-host",
                            "image": "busybox",
                            "resources": {"requests": dict(requests), "limits": dict(requests)},
                        }
                    ],
                    "restartPolicy": "Never",
                }
            },
        }

    def pod_templates(self) -> list[dict[str, Any]]:
        return [self.pod_template(i) for i in range(len(self.node_pools))]

    def provisioning_request(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "provisioningClassName": QUEUED_CLASS,
            "podSets": [
                {"count": self.hosts_per_pool, "podTemplateRef": {"name": name}} for name in self.template_names
            ],
        }
        if self.max_run_duration_seconds is not None:
            # The API takes parameters as strings.
            spec["parameters"] = {"maxRunDurationSeconds": str(self.max_run_duration_seconds)}
        return {
            "apiVersion": API_VERSION,
            "kind": "ProvisioningRequest",
            "metadata": self._meta(self.name),
            "spec": spec,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "pod_templates": list(self.template_names),
            "node_pools": list(self.node_pools),
            "nodes": self.hosts_per_pool * len(self.node_pools),
            "max_run_duration_seconds": self.max_run_duration_seconds,
            "annotations": consume_annotations(self.name),
        }


def plan_provisioning_request(
    *,
    tpu: TpuSlice,
    node_pools: Sequence[str],
    name: str,
    namespace: str,
    max_run_duration_seconds: object = None,
    labels: Mapping[str, str] | None = None,
) -> ProvisioningRequestPlan:
    """Check the inputs (UserInputError naming the field) and plan the objects."""
    seconds = check_max_run_duration(max_run_duration_seconds)
    pools = [node_pools] if isinstance(node_pools, str) else list(node_pools or [])
    for pool in pools:
        check_node_pool_name(pool)
    wanted = tpu.num_slices if tpu.multi_host else 1
    if len(pools) != wanted:
        raise UserInputError(
            "node_pool_name",
            pools,
            f"the {tpu.summary()} slice lives in {wanted} node pool(s) (one per multi-host slice); name each of them",
        )
    return ProvisioningRequestPlan(
        name=check_name("name", name, max_len=NAME_MAX),
        namespace=check_namespace(namespace),
        tpu=tpu,
        node_pools=tuple(pools),
        max_run_duration_seconds=seconds,
        labels=check_labels("labels", labels) if labels else None,
    )


# --- status ----------------------------------------------------------------------------------------
def condition(obj: Mapping[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


@dataclass(frozen=True)
class RequestVerdict:
    state: str  # provisioned | failed | waiting
    reason: str

    @property
    def done(self) -> bool:
        return self.state != "waiting"


def request_verdict(obj: Mapping[str, Any] | None) -> RequestVerdict:
    """What a ProvisioningRequest's conditions say, with GKE's reason and message."""
    if obj is None:
        return RequestVerdict("failed", "the ProvisioningRequest no longer exists (deleted while waiting)")
    for kind in FINAL_CONDITIONS:
        cond = condition(obj, kind)
        if cond and cond.get("status") == "True":
            return RequestVerdict("failed", f"{kind}: {cond.get('reason', '')}: {cond.get('message', '')}")
    provisioned = condition(obj, "Provisioned")
    if provisioned and provisioned.get("status") == "True":
        return RequestVerdict("provisioned", f"Provisioned: {provisioned.get('reason', '')}")
    if provisioned:
        return RequestVerdict(
            "waiting", f"Provisioned=False: {provisioned.get('reason', '')}: {provisioned.get('message', '')}"
        )
    accepted = condition(obj, "Accepted")
    if accepted and accepted.get("status") == "True":
        return RequestVerdict("waiting", "Accepted, waiting for capacity")
    if accepted:
        return RequestVerdict("waiting", f"Accepted=False: {accepted.get('reason', '')}: {accepted.get('message', '')}")
    return RequestVerdict("waiting", "not accepted yet (no conditions)")
