"""The HIGH_THROUGHPUT workload policy that places a multi-host tpu7x node pool, when the user names none.

GKE places multi-host Ironwood (tpu7x) pools with ``placementPolicy.policyName``: a Compute regional
resource policy of type HIGH_THROUGHPUT for the slice's topology (what ``gcloud compute resource-policies
create workload-policy NAME --type=HIGH_THROUGHPUT --accelerator-topology=2x2x2`` makes). When no
``workload_policy`` is given, GKECreateTPUNodePoolOperator makes one itself, named from the task instance
(so a retry adopts it) and with a description naming its owner's ``tpuflow-key`` and the digests of its exact
run and DAG (``tpuflow-owner-run``, ``tpuflow-owner-dag``: what the orphan reaper judges it by; resource policies
have no labels), and the delete operator removes it once the pools are gone. A policy the user gave is never
touched.

Pure module (no google-cloud imports), like tpuflow.gke.nodepool_spec: the render command shows the same
body the operator sends (Compute v1 REST JSON form).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuflow.labels import (
    GCE_DAG_LABEL,
    GCE_OWNER_DAG_LABEL,
    GCE_OWNER_RUN_LABEL,
    GCE_RUN_LABEL,
    GCE_TASK_LABEL,
    OWNER_KEY_LABEL,
)
from tpuflow.naming import TaskIdentity, dns_name, run_key

POLICY_TYPE = "HIGH_THROUGHPUT"
POLICY_NAME_MAX = 63  # a Compute resource name
COMPUTE_API = "https://compute.googleapis.com/compute/v1"
_OWNER_RE = re.compile(rf"\b{OWNER_KEY_LABEL}=([a-z0-9]+)\b")
_OWNER_RUN_RE = re.compile(rf"\b{GCE_OWNER_RUN_LABEL}=([0-9a-f]+)\b")
_OWNER_DAG_RE = re.compile(rf"\b{GCE_OWNER_DAG_LABEL}=([0-9a-f]+)\b")


def region_of(location: str) -> str:
    """The region of a zone (us-east5-b -> us-east5); a region stays itself."""
    return location.rsplit("-", 1)[0] if location.count("-") == 2 else location


def workload_policy_name(identity: TaskIdentity | None, generation: str, topology: str) -> str:
    """The name of the policy the create task makes: from the task instance, never the try number, so a
    retry (and the delete task, from ``created_by_task_id``) finds it."""
    if identity is None:
        return dns_name("tpuflow-wp", generation, topology, key=run_key("render", generation, topology), max_len=63)
    return identity.dns_name("tpuflow-wp", identity.task_id, max_len=POLICY_NAME_MAX)


def owner_of(description: str | None) -> str | None:
    """The ``tpuflow-key`` a policy's description names as its owner (None: not made by tpuflow)."""
    found = _OWNER_RE.search(description or "")
    return found.group(1) if found else None


def owner_digests_of(description: str | None) -> tuple[str, str] | None:
    """The (run digest, DAG digest) a policy's description names (``tpuflow-owner-run=R tpuflow-owner-dag=D``),
    or None: its owner cannot be read (made before tpuflow recorded them, or edited)."""
    run, dag = _OWNER_RUN_RE.search(description or ""), _OWNER_DAG_RE.search(description or "")
    return (run.group(1), dag.group(1)) if run and dag else None


@dataclass(frozen=True)
class WorkloadPolicyPlan:
    """The workload policy one create task makes (and its delete task removes)."""

    project_id: str
    region: str
    name: str
    topology: str
    owner_key: str | None = None
    owner: str = ""  # dag, run and task, for people reading the description
    owner_digests: str = ""  # "tpuflow-owner-run=R tpuflow-owner-dag=D": the exact owner the reaper reads

    @property
    def parent(self) -> str:
        return f"projects/{self.project_id}/regions/{self.region}"

    @property
    def description(self) -> str:
        who = f"{OWNER_KEY_LABEL}={self.owner_key}" + (f" ({self.owner})" if self.owner else "")
        if self.owner_digests:
            who += f"; owner {self.owner_digests}"
        if not self.owner_key:
            who = "a GKECreateTPUNodePoolOperator task"
        return f"Made by tpuflow for the TPU node pools of {who}; deleted with them."

    def body(self) -> dict[str, Any]:
        """The ResourcePolicy insert body (Compute v1 REST JSON)."""
        return {
            "name": self.name,
            "description": self.description,
            "workloadPolicy": {"type": POLICY_TYPE, "acceleratorTopology": self.topology},
        }

    def gcloud(self) -> str:
        return (
            f"gcloud compute resource-policies create workload-policy {self.name} --type={POLICY_TYPE} "
            f"--accelerator-topology={self.topology} --project={self.project_id} --region={self.region}"
        )

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "region": self.region, "type": POLICY_TYPE, "topology": self.topology}

    def differences(self, actual: Mapping[str, Any]) -> list[str]:
        """Why an existing policy of this name (REST JSON) is not the one this task would make."""
        policy = actual.get("workloadPolicy") or {}
        diffs = []
        if policy.get("type") != POLICY_TYPE:
            diffs.append(f"type {policy.get('type') or 'unset'}, not {POLICY_TYPE}")
        if policy.get("acceleratorTopology") != self.topology:
            diffs.append(f"acceleratorTopology {policy.get('acceleratorTopology') or 'unset'}, not {self.topology}")
        if not actual.get("workloadPolicy"):
            kinds = [k for k in actual if k.endswith("Policy")]
            diffs = [f"it is a {', '.join(kinds) or 'non-workload'} resource policy, not a workload policy"]
        return diffs


def plan_workload_policy(
    *,
    project_id: str,
    zone: str,
    generation: str,
    topology: str,
    identity: TaskIdentity | None,
    resource_labels: Mapping[str, str],
) -> WorkloadPolicyPlan:
    owner = ", ".join(
        f"{what} {resource_labels[label]}"
        for what, label in (("dag", GCE_DAG_LABEL), ("run", GCE_RUN_LABEL), ("task", GCE_TASK_LABEL))
        if resource_labels.get(label)
    )
    return WorkloadPolicyPlan(
        project_id=project_id,
        region=region_of(zone),
        name=workload_policy_name(identity, generation, topology),
        topology=topology,
        owner_key=resource_labels.get(OWNER_KEY_LABEL),
        owner=owner,
        owner_digests=" ".join(
            f"{label}={resource_labels[label]}"
            for label in (GCE_OWNER_RUN_LABEL, GCE_OWNER_DAG_LABEL)
            if resource_labels.get(label)
        ),
    )
