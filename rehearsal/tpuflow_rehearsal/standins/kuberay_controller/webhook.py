"""The GKE TPU webhook the Ray Operator add-on installs, as the stand-in plays it.

From GKE's documentation of the add-on (and github.com/ai-on-gke/kuberay-tpu-webhook): on admission
of a RayCluster, RayService or RayJob, every worker group that requests ``google.com/tpu`` must have
``numOfHosts`` = chips of its ``cloud.google.com/gke-tpu-topology`` node selector / ``google.com/tpu``
per pod (at least 1), or the request is denied with ``DENIAL``. When the TPU worker pods are created
the webhook gives each one a hostname ``<group>-<replica>-<host>`` under the RayCluster's headless
Service ``<cluster>-headless`` and injects ``TPU_WORKER_ID`` (the host's index in its slice),
``TPU_NAME`` (the slice, ``<group>-<replica>``), ``TPU_WORKER_HOSTNAMES`` (every host of the slice, as
``<hostname>.<cluster>-headless``) and, as the webhook of KubeRay >= 1.4 does for TorchTPU,
``TORCH_TPU_TOPOLOGY`` (the topology as x,y,z, plus the cores per chip where a chip has several) and
``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (every host's ports 8471.. one per TPU device) into their containers:
the values seed 004 step 4 shows for v6e 4x4 and tpu7x 2x2x2.

Written from that documented behaviour, not from the operators' pre-flight check
(tpuflow.kuberay.webhook_rules): the stand-in must catch what the operators get wrong.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tpuflow_rehearsal.standins.gke_tpu import (
    GKE_ACCELERATOR_LABEL,
    GKE_TOPOLOGY_LABEL,
    TPU_RESOURCE,
    SliceShape,
    chips_in,
    family_of,
)
from tpuflow_rehearsal.standins.kubernetes_api import ResourceType, admission_denied

NAME = "validate-raycluster.gke-tpu.ray.io"
DENIAL = "Number of workers in worker group not equal to specified topology"
# where each kind keeps its RayCluster spec
_CLUSTER_SPEC = {"rayclusters": (), "rayservices": ("rayClusterConfig",), "rayjobs": ("rayClusterSpec",)}


def _count(value: Any, default: int) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def tpus_requested(pod_template: Mapping[str, Any]) -> int:
    """google.com/tpu one pod of the template asks for (its largest container limit or request)."""
    asks = [
        _count(((c.get("resources") or {}).get(part) or {}).get(TPU_RESOURCE), 0)
        for c in (pod_template.get("spec") or {}).get("containers") or []
        for part in ("limits", "requests")
    ]
    return max(asks, default=0)


def tpu_groups(cluster_spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The worker groups that request TPUs."""
    for group in cluster_spec.get("workerGroupSpecs") or []:
        if tpus_requested(group.get("template") or {}) > 0:
            yield group


def selector(group: Mapping[str, Any]) -> dict[str, str]:
    return dict(((group.get("template") or {}).get("spec") or {}).get("nodeSelector") or {})


def hosts_for(group: Mapping[str, Any]) -> int | None:
    """The numOfHosts the webhook accepts for a TPU group; None when its topology label is missing or invalid."""
    try:
        chips = chips_in(selector(group).get(GKE_TOPOLOGY_LABEL, ""))
    except ValueError:
        return None
    return max(chips // tpus_requested(group.get("template") or {}), 1)


def admits(cluster_spec: Mapping[str, Any]) -> bool:
    return all(hosts_for(g) == _count(g.get("numOfHosts", 1), 1) for g in tpu_groups(cluster_spec))


def tpu_webhook(operation: str, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Admission hook of the Kubernetes stand-in (creates and updates)."""
    path = _CLUSTER_SPEC.get(rtype.plural)
    if path is None:
        return
    spec: Mapping[str, Any] = obj.get("spec") or {}
    for key in path:
        spec = spec.get(key) or {}
    if not admits(spec):
        raise admission_denied(NAME, DENIAL)


def slice_shape(group: Mapping[str, Any]) -> SliceShape:
    """The slice an (admitted) TPU worker group runs on."""
    labels = selector(group)
    return SliceShape(
        accelerator=labels.get(GKE_ACCELERATOR_LABEL, ""),
        topology=labels.get(GKE_TOPOLOGY_LABEL, ""),
        chips_per_host=tpus_requested(group.get("template") or {}),
        hosts=_count(group.get("numOfHosts", 1), 1),
        slices=max(_count(group.get("replicas", 1), 1), 1),
    )


SLICEBUILDER_PORT = 8471


def headless_service(cluster: str) -> str:
    return f"{cluster}-headless"


def pod_hostname(group: Mapping[str, Any], replica: int, host: int) -> str:
    return f"{group.get('groupName', 'workers')}-{replica}-{host}"


def worker_env(cluster: str, group: Mapping[str, Any], replica: int, host: int) -> dict[str, str]:
    """What the webhook injects into the TPU worker pod that is host `host` of slice `replica` of `group`."""
    shape = slice_shape(group)
    domain = headless_service(cluster)
    hostnames = [f"{pod_hostname(group, replica, h)}.{domain}" for h in range(shape.hosts)]
    fam = family_of(shape.accelerator)
    cores = fam.cores_per_chip if fam else 1
    dims = shape.topology.lower().split("x") if shape.topology else ["1"]
    topology = [*dims, *["1"] * (3 - len(dims))] + ([str(cores)] if cores > 1 else [])
    devices = max(shape.chips_per_host * cores, 1)
    addresses = [f"{h}:{SLICEBUILDER_PORT + d}" for h in hostnames for d in range(devices)]
    return {
        "TPU_WORKER_ID": str(host),
        "TPU_NAME": f"{group.get('groupName', 'workers')}-{replica}",
        "TPU_WORKER_HOSTNAMES": ",".join(hostnames),
        "TORCH_TPU_TOPOLOGY": ",".join(topology),
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(addresses),
    }
