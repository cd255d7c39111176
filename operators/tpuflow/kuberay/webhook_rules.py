"""The rule GKE's KubeRay TPU webhook enforces on RayCluster admission, as a pure function.

The webhook (github.com/ai-on-gke/kuberay-tpu-webhook) rejects a RayCluster, RayService or RayJob whose
TPU worker group has numOfHosts != max(chips(topology) / google.com/tpu, 1), with the message
WEBHOOK_DENIAL. The operator side keeps it as a pre-flight check: KubeRayCreateClusterOperator checks a
user-supplied manifest with it (``tpu_preflight``) before sending anything, and explains a webhook denial
with the group and the numOfHosts to set; ``slice_of_group`` reads a ready cluster's slice for the XCom.
The simulated webhook in tpuflow_rehearsal.standins is written separately from GKE's documentation, so a
mistake here shows up there as a denial instead of being shared.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tpuflow.tpu import TpuSlice, resolve_generation
from tpuflow.tpu.slice import GKE_ACCELERATOR_LABEL, GKE_TOPOLOGY_LABEL, TPU_RESOURCE

WEBHOOK_DENIAL = "Number of workers in worker group not equal to specified topology"


@dataclass(frozen=True)
class TpuGroupProblem:
    index: int
    group: str
    num_of_hosts: int
    expected_hosts: int | None
    topology: str | None
    tpus_per_host: int
    message: str

    @property
    def field(self) -> str:
        return f"workerGroupSpecs[{self.index}].numOfHosts"


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def tpus_requested(pod_template: Mapping[str, Any]) -> int:
    """google.com/tpu per pod (largest of limits/requests over the containers)."""
    most = 0
    for container in (pod_template.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        for part in ("limits", "requests"):
            most = max(most, _int((res.get(part) or {}).get(TPU_RESOURCE)))
    return most


def topology_chips(topology: str) -> int | None:
    try:
        return math.prod(int(d) for d in topology.lower().split("x"))
    except ValueError:
        return None


def tpu_worker_groups(cluster_spec: Mapping[str, Any]) -> Iterator[tuple[int, Mapping[str, Any], int]]:
    """(index, group, google.com/tpu per pod) for each worker group that requests TPUs."""
    for index, group in enumerate(cluster_spec.get("workerGroupSpecs") or []):
        per_host = tpus_requested(group.get("template") or {})
        if per_host > 0:
            yield index, group, per_host


def node_selector(group: Mapping[str, Any]) -> dict[str, str]:
    return dict(((group.get("template") or {}).get("spec") or {}).get("nodeSelector") or {})


def tpu_group_problems(cluster_spec: Mapping[str, Any]) -> list[TpuGroupProblem]:
    """What the TPU webhook would reject in a RayCluster spec (empty when it would admit it)."""
    problems = []
    for index, group, per_host in tpu_worker_groups(cluster_spec):
        selector = node_selector(group)
        hosts = _int(group.get("numOfHosts", 1), 1)
        name = str(group.get("groupName", f"#{index}"))
        topology = selector.get(GKE_TOPOLOGY_LABEL)
        chips = topology_chips(topology) if topology else None
        if chips is None:
            problems.append(
                TpuGroupProblem(
                    index,
                    name,
                    hosts,
                    None,
                    topology,
                    per_host,
                    f"worker group {name!r} requests {TPU_RESOURCE} but its nodeSelector has no valid "
                    f"{GKE_TOPOLOGY_LABEL} (and {GKE_ACCELERATOR_LABEL})",
                )
            )
            continue
        expected = max(chips // per_host, 1)
        if hosts != expected:
            problems.append(
                TpuGroupProblem(
                    index,
                    name,
                    hosts,
                    expected,
                    topology,
                    per_host,
                    f"worker group {name!r}: numOfHosts={hosts}, but topology {topology} ({chips} chips) with "
                    f"{TPU_RESOURCE}={per_host} per host needs numOfHosts={expected}",
                )
            )
    return problems


def slice_of_group(group: Mapping[str, Any]) -> TpuSlice:
    """The TpuSlice a TPU worker group asks for: GKE labels, google.com/tpu per host, replicas = slices.

    Raises SliceSpecError (a UserInputError) when the group names no slice the catalog knows.
    """
    selector = node_selector(group)
    gen = resolve_generation(selector.get(GKE_ACCELERATOR_LABEL, ""))
    per_host = tpus_requested(group.get("template") or {})
    return TpuSlice.from_spec(
        gen.name,
        selector.get(GKE_TOPOLOGY_LABEL, ""),
        gen.machine_type(per_host),
        max(_int(group.get("replicas", 1), 1), 1),
    )
