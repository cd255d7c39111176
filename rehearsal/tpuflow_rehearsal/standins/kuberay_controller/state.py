"""Per-object controller state and small helpers shared by the RayCluster and RayService reconcilers."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuflow_rehearsal.standins.kuberay_controller.seams import RayClusterHandle
from tpuflow_rehearsal.standins.kuberay_controller.webhook import tpus_requested


@dataclass
class ClusterState:
    uid: str
    launching: threading.Thread | None = None
    handle: RayClusterHandle | None = None
    visible: RayClusterHandle | None = None  # the handle as of this reconcile pass (a launch may finish mid-pass)
    error: str | None = None
    stopping: bool = False
    provisioned: bool = False
    last_logs: float = 0.0
    failures: int = 0  # failed launches: the head pod's restartCount
    retry_at: float = 0.0  # a failed head is restarted from then on, with a doubling backoff (CrashLoopBackOff)


@dataclass
class ServiceState:
    deployed_hash: dict[str, str] = field(default_factory=dict)  # cluster name -> serveConfigV2 hash
    serve: dict[str, dict[str, Any]] = field(default_factory=dict)  # cluster name -> last REST status
    polled: dict[str, float] = field(default_factory=dict)
    ever_ready: bool = False


def short_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:5]


def stamp_transitions(conditions: list[dict[str, Any]], old_status: Mapping[str, Any], stamp: str) -> None:
    """Each condition keeps the lastTransitionTime it had in ``old_status`` while its status is the same, else
    takes ``stamp`` (Kubernetes' condition convention, which KubeRay's status updates follow)."""
    old_conds = {c["type"]: c for c in old_status.get("conditions") or []}
    for c in conditions:
        prev = old_conds.get(c["type"])
        c["lastTransitionTime"] = (
            prev["lastTransitionTime"]
            if prev and prev.get("status") == c["status"] and prev.get("lastTransitionTime")
            else stamp
        )


def owner_ref(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj.get("apiVersion", "ray.io/v1"),
        "kind": obj.get("kind"),
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def involved(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "kind": obj.get("kind"),
        "name": meta["name"],
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "apiVersion": obj.get("apiVersion"),
    }


_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "m": 1e-3,
}


def _quantity(value: Any) -> float:
    text = str(value or "0").strip()
    for suffix, factor in sorted(_SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return float(text[: -len(suffix)] or 0) * factor
    try:
        return float(text)
    except ValueError:
        return 0.0


def _format_memory(total: float) -> str:
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = 2 ** (10 * ("KMGTPE".index(suffix[0]) + 1))
        if total >= factor and total % factor == 0:
            return f"{int(total // factor)}{suffix}"
    return str(int(total))


def _format_cpu(total: float) -> str:
    millis = round(total * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def desired_resources(cluster: Mapping[str, Any]) -> dict[str, str]:
    """status.desiredCPU / desiredMemory as KubeRay sums them: every pod's container requests (else limits)."""
    spec = cluster.get("spec") or {}
    templates = [((spec.get("headGroupSpec") or {}).get("template") or {}, 1)]
    for group in spec.get("workerGroupSpecs") or []:
        pods = int(group.get("replicas", 0) or 0) * int(group.get("numOfHosts", 1) or 1)
        templates.append((group.get("template") or {}, pods))
    totals = {"cpu": 0.0, "memory": 0.0}
    for template, pods in templates:
        for c in (template.get("spec") or {}).get("containers") or []:
            res = c.get("resources") or {}
            for key in totals:
                value = (res.get("requests") or {}).get(key, (res.get("limits") or {}).get(key))
                totals[key] += _quantity(value) * pods
    return {"cpu": _format_cpu(totals["cpu"]), "memory": _format_memory(totals["memory"])}


def tpus_per_host(group: Mapping[str, Any]) -> int:
    return tpus_requested(group.get("template") or {})
