"""Per-object controller state and small helpers shared by the RayCluster and RayService reconcilers."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuflow.dev.standins.kuberay_controller.seams import RayClusterHandle
from tpuflow.dev.standins.kuberay_controller.webhook import tpus_requested


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


@dataclass
class ServiceState:
    deployed_hash: dict[str, str] = field(default_factory=dict)  # cluster name -> serveConfigV2 hash
    serve: dict[str, dict[str, Any]] = field(default_factory=dict)  # cluster name -> last REST status
    polled: dict[str, float] = field(default_factory=dict)
    ever_ready: bool = False


def short_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:5]


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


def tpus_per_host(group: Mapping[str, Any]) -> int:
    return tpus_requested(group.get("template") or {})
