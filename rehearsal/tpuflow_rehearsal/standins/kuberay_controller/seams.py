"""The controller's seams: which nodes exist (node pools) and how a Ray cluster is launched."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpuflow_rehearsal.standins.capacity import CapacitySettings
from tpuflow_rehearsal.standins.gke_tpu import SliceShape


class NodePoolDirectory(Protocol):
    """Which nodes exist (the GKE stand-in implements it)."""

    def matching_nodes(self, node_selector: Mapping[str, str], consumer: str | None = None) -> int:
        """Number of nodes whose labels include every node_selector entry (``consumer``: the
        ProvisioningRequest the pods consume, if any)."""
        ...


@dataclass
class StaticNodePools:
    """A NodePoolDirectory from a fixed list of (labels, node count); `cpu_nodes` for the head."""

    pools: list[tuple[dict[str, str], int]] = field(default_factory=list)
    cpu_nodes: int = 1

    @classmethod
    def for_slice(cls, tpu: SliceShape, slices: int | None = None) -> StaticNodePools:
        """Nodes for `slices` (default: the shape's own count) slices of the shape."""
        return cls([(tpu.node_selector, tpu.hosts * (slices or tpu.slices))])

    def matching_nodes(self, node_selector: Mapping[str, str], consumer: str | None = None) -> int:
        return sum(n for labels, n in self.pools if all(labels.get(k) == v for k, v in node_selector.items()))

    def total_nodes(self) -> int:
        return self.cpu_nodes + sum(n for _, n in self.pools)


class GkeNodePools:
    """NodePoolDirectory over the GKE stand-in (tpuflow_rehearsal.standins.gke_api): the GKEApiStandin object
    itself (in-process), or its base URL (GET /_standin/state, POST /_standin/nodes, /_standin/capacity).

    Counts the nodes of RUNNING pools whose node labels include the selector: the nodes they have now
    (flex-start and queued pools grow only when the simulated autoscaler, tpuflow_rehearsal.standins.capacity,
    adds nodes). `cluster`
    ("projects/P/locations/L/clusters/C") limits the count to the GKE cluster the stand-in plays.
    """

    def __init__(self, gke: object, *, cluster: str | None = None, cpu_nodes: int = 1) -> None:
        if not isinstance(gke, str) and not callable(getattr(gke, "find_node_pools", None)):
            raise TypeError("give a GKEApiStandin (with find_node_pools) or the stand-in's base URL")
        self.gke, self.cluster, self.cpu_nodes = gke, cluster, cpu_nodes

    def _http(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{str(self.gke).rstrip('/')}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return dict(json.loads(resp.read() or b"{}"))

    def matching_nodes(self, node_selector: Mapping[str, str], consumer: str | None = None) -> int:
        """Nodes of RUNNING pools whose labels include the selector; a queued pool's nodes belong to the
        ProvisioningRequests that booked them, so they count only for that request's pods (``consumer``)."""
        total = 0
        for pool in self.pool_states():
            labels = pool.get("nodeLabels") or {}
            if pool.get("status") != "RUNNING" or any(labels.get(k) != str(v) for k, v in node_selector.items()):
                continue
            if pool.get("capacity") == "queued":
                total += int((pool.get("bookings") or {}).get(consumer or "", 0))
            else:
                total += int(pool.get("nodeCount") or 0)
        return total

    # --- what the simulated autoscaler (tpuflow_rehearsal.standins.capacity) reads and does ---
    def pool_states(self) -> list[dict[str, Any]]:
        if isinstance(self.gke, str):
            pools = self._http("GET", "/_standin/state").get("nodePools") or []
            return [p for p in pools if not self.cluster or p.get("cluster") == self.cluster]
        return list(self.gke.node_pools(self.cluster))  # type: ignore[attr-defined]

    def capacity_settings(self) -> Any:
        """The GKE stand-in's knobs (in-process), or a CapacitySettings read over HTTP."""

        if not isinstance(self.gke, str):
            return self.gke.capacity  # type: ignore[attr-defined]
        settings = CapacitySettings()
        settings.update(self._http("GET", "/_standin/capacity"))
        return settings

    def _set_nodes(self, cluster: str, pool: str, nodes: int | None, consumer: str | None) -> None:
        if isinstance(self.gke, str):
            self._http(
                "POST", "/_standin/nodes", {"cluster": cluster, "name": pool, "nodes": nodes, "consumer": consumer}
            )
        else:
            self.gke.set_nodes(cluster, pool, nodes, consumer=consumer)  # type: ignore[attr-defined]

    def scale(self, cluster: str, pool: str, nodes: int) -> None:
        self._set_nodes(cluster, pool, nodes, None)

    def book(self, cluster: str, pool: str, consumer: str, nodes: int) -> None:
        self._set_nodes(cluster, pool, nodes, consumer)

    def release(self, cluster: str, pool: str, consumer: str) -> None:
        self._set_nodes(cluster, pool, None, consumer)

    def total_nodes(self) -> int:
        if isinstance(self.gke, str):
            pools = self._http("GET", "/_standin/state").get("nodePools") or []
        else:
            pools = self.gke.node_pools(self.cluster)  # type: ignore[attr-defined]
        return self.cpu_nodes + sum(int(p.get("nodeCount") or 0) for p in pools)


@dataclass(frozen=True)
class LaunchSpec:
    """What a ClusterLauncher starts for one RayCluster."""

    key: str  # unique per RayCluster object: "<namespace>-<name>-<uid8>"
    namespace: str
    name: str
    tpu: SliceShape | None  # the first TPU worker group's slice (None: no TPU workers)
    env: dict[str, str]


class RayClusterHandle(Protocol):
    dashboard_url: str
    gcs_address: str
    serve_port: int
    metrics_port: int  # the head's Prometheus exporter (KubeRay's "metrics" port, 8080); 0: none

    def stop(self) -> None: ...

    def deploy_serve(self, config: dict[str, Any]) -> None: ...

    def serve_status(self) -> dict[str, Any]: ...

    def log_tail(self, role: str, lines: int) -> list[str]: ...


class ClusterLauncher(Protocol):
    def launch(self, spec: LaunchSpec) -> RayClusterHandle: ...
