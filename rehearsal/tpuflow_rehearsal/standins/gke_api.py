"""A loopback stand-in for the GKE v1 REST API: node pools and their operations.

The real google-cloud-container client (REST transport, anonymous credentials, ``api_endpoint``
pointing here) and so the tpuflow hooks and operators talk to it unchanged. It serves:

- ``POST/GET .../clusters/C/nodePools``, ``GET/DELETE .../nodePools/NP``, ``GET .../clusters/C``
- ``PUT .../nodePools/NP`` (nodePools.update), resourceLabels only: the pool's GCE labels are replaced by the
  request's when its UPGRADE_NODES operation is done (the pool stays RUNNING: GKE relabels the VMs in place);
  any other update field is a 400
- ``GET .../locations/L/operations/OP`` and ``GET .../locations/L/operations``

under ``/v1/projects/P/locations/L``, and Compute's regional resource policies (workload policies) under
``/compute/v1`` (``tpuflow_rehearsal.standins.compute_api``; the connection's ``compute_api_endpoint``), and the
Cloud Quotas API's TPU QuotaInfos under ``/v1/projects/P/locations/global/services/S/quotaInfos``
(``tpuflow_rehearsal.standins.cloud_quotas``; ``quotas_api_endpoint``). Creates and deletes return a RUNNING Operation that is DONE
after ``operation_seconds``; a pool is PROVISIONING, then RUNNING (or ERROR when the operation
failed), STOPPING, then gone. Errors look like GKE's: ``{"error": {"code", "message", "status"}}``
for rejected requests, ``Operation.error`` plus ``nodepoolConditions`` for failed operations, with
GKE's wording (409 "Already exists", 429 "Too many operations: cluster ... hits the concurrent
operations quota", "[GCE_STOCKOUT]", "Quota '...' exceeded", 403 "Required ... permission").

A pool's ``config.maxRunDuration`` is enforced as GKE does: each node is deleted that long after it started
(the pool stays, with no nodes, until it is deleted), whether or not anything else is up; flex-start and
queued pools may not ask for more than seven days.

Validation follows GKE for TPU pools: machine type vs topology, a tpuTopology (with or without
``type: COMPACT``: gcloud's ``--tpu-topology`` sends the topology alone, as in the GKE tutorials) only for
multi-host slices (never on single-host ones), multi-host tpu7x placed by a workload policy or by its
tpuTopology alone (never COMPACT), node count = hosts of the slice, unknown JSON fields rejected. A
placementPolicy.policyName must name a HIGH_THROUGHPUT workload policy of the pool's region (made through
the Compute stand-in, or given to the stand-in up front with ``workload_policies``: those exist everywhere).

Stand-in only paths (not GKE):

- ``POST /_standin/faults`` ``{"faults": [{"kind": "stockout", "capacity": "spot", "times": 1}]}``
  queues errors for the next create (or ``"on": "delete"``) calls. Kinds: stockout, quota,
  too_many_operations, permission, invalid_argument, already_exists, internal, stuck. ``stage``:
  ``request`` (the call is refused) or ``operation`` (the operation fails; default for stockout and
  quota, as on GKE). ``stuck`` (creates only, stage operation): the create's operation stays RUNNING for
  ``seconds`` (default 3600), then succeeds; GKE refuses other operations on the pool meanwhile and cannot
  cancel it (operations.cancel is for node pool upgrades only, and is not served here).
  ``capacity``: on-demand | spot | reservation | flex-start | queued. ``zone``: only pools in that zone
  (a zone's stockout or quota, as a regional cluster sees one zone run dry while the next has room).
  ``GET`` lists pending faults, ``DELETE`` clears them.
- ``POST /_standin/match`` ``{"nodeSelector": {...}, "nodes": 4}``: RUNNING pools whose simulated
  node labels include the selector and that have (or can scale to) that many nodes.
- ``POST /_standin/workload-policies`` ``{"name": "wp", "acceleratorTopology": "2x2x2"}``
- ``POST /_standin/clusters`` ``{"name": "projects/P/locations/L/clusters/C"}`` (when the stand-in
  was started with a fixed cluster list; by default every cluster exists)
- ``POST /_standin/config`` ``{"operationSeconds": 0.2, "maxConcurrentOperations": 5}``
- ``POST /_standin/quotas`` ``{"quotaId": "PREEMPTIBLE-TPU-V6E-per-project-region", "value": 16,
  "dimensions": {"region": "us-east5"}}``: the project's quota (no dimensions: every region's default)
- ``POST /_standin/capacity`` ``{"queued": {"available": false}, "flex-start": {"delaySeconds": 2}}``: the
  simulated autoscaler's knobs (tpuflow_rehearsal.standins.capacity); ``POST /_standin/nodes`` is its hand
- ``GET /_standin/state``, ``GET /_standin/requests``, ``POST /_standin/reset``, ``GET /_standin/health``

Library: ``with GKEApiStandin(operation_seconds=0.2) as gke: gke.url``. Shell:
``python -m tpuflow_rehearsal.standins.gke_api --port 0`` prints the base URL, then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from tpuflow_rehearsal.standins.capacity import CapacitySettings
from tpuflow_rehearsal.standins.cloud_quotas import CloudQuotas
from tpuflow_rehearsal.standins.compute_api import COMPUTE_PREFIX, ComputeResourcePolicies
from tpuflow_rehearsal.standins.gke_tpu import (
    GKE_ACCELERATOR_LABEL,
    GKE_TOPOLOGY_LABEL,
    MULTI_HOST_CHIPS_PER_VM,
    TpuMachineFamily,
    chips_in,
    tpu_machine_family,
)
from tpuflow_rehearsal.standins.loopback_http import LoopbackHandler, LoopbackServer

GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
_API = "https://container.googleapis.com/v1"
_POOL_NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
_MACHINE_RE = re.compile(r"^(?P<family>.+)-(?P<chips>\d+)t$")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# GCE label rules (GKE checks resourceLabels against them)
_GCE_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_GCE_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_MAX_GCE_LABELS = 64
# what nodePools.update names the pool by, besides its path: accepted, not updates
_UPDATE_IDENTITY_FIELDS = frozenset({"name", "projectId", "zone", "clusterId", "nodePoolId"})
FAULT_KINDS = (
    "stockout",
    "quota",
    "too_many_operations",
    "permission",
    "invalid_argument",
    "already_exists",
    "internal",
    "stuck",
)
CAPACITY_KINDS = ("on-demand", "spot", "reservation", "flex-start", "queued")


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    """An HTTP error answer in GKE's JSON error shape."""

    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


def _invalid(message: str) -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", message)


# --- TPU rules ----------------------------------------------------------------------------------------
def tpu_machine(machine_type: str) -> tuple[TpuMachineFamily, int] | None:
    """(machine family, chips per VM) for a TPU machine type; None for other machine types."""
    try:
        return tpu_machine_family(machine_type)
    except ValueError as err:
        raise _invalid(str(err)) from err


def _capacity_kind(pool: Mapping[str, Any]) -> str:
    config = pool.get("config") or {}
    if (pool.get("queuedProvisioning") or {}).get("enabled"):
        return "queued"
    if config.get("flexStart"):
        return "flex-start"
    if config.get("spot") or config.get("preemptible"):
        return "spot"
    if (config.get("reservationAffinity") or {}).get("consumeReservationType") == "SPECIFIC_RESERVATION":
        return "reservation"
    return "on-demand"


def _node_count(pool: Mapping[str, Any]) -> tuple[int, int]:
    """(nodes created now, nodes it may scale to)."""
    initial = int(pool.get("initialNodeCount") or 0)
    scaling = pool.get("autoscaling") or {}
    ceiling = initial
    if scaling.get("enabled"):
        ceiling = max(initial, int(scaling.get("maxNodeCount") or 0), int(scaling.get("totalMaxNodeCount") or 0))
    return initial, ceiling


FLEX_MAX_RUN_S = 7 * 24 * 3600


def max_run_seconds(pool: Mapping[str, Any]) -> float | None:
    """NodeConfig.maxRunDuration (protobuf JSON Duration, e.g. "3600s") in seconds; None when unset."""
    raw = (pool.get("config") or {}).get("maxRunDuration")
    if not raw:
        return None
    return float(str(raw).removesuffix("s"))


def validate_node_pool(pool: Mapping[str, Any], workload_policies: Mapping[str, str]) -> str | None:
    """Check a NodePool like GKE does for TPU pools; return the TPU topology its nodes get (None: not TPU)."""
    name = pool.get("name") or ""
    if not _POOL_NAME_RE.match(name):
        raise _invalid(
            f'Invalid node pool name "{name}": it must match [a-z]([-a-z0-9]*[a-z0-9])? and have at most 40 characters.'
        )
    config = pool.get("config") or {}
    machine_type = config.get("machineType") or ""
    placement = pool.get("placementPolicy") or {}
    topology: str | None = placement.get("tpuTopology")
    policy, ptype = placement.get("policyName"), placement.get("type")
    nodes, ceiling = _node_count(pool)
    affinity = (config.get("reservationAffinity") or {}).get("consumeReservationType")
    if config.get("spot") and affinity == "SPECIFIC_RESERVATION":
        raise _invalid("Spot VMs cannot consume a specific reservation; drop spot or the reservation affinity.")
    if affinity == "SPECIFIC_RESERVATION":
        values = (config.get("reservationAffinity") or {}).get("values") or []
        if (config.get("reservationAffinity") or {}).get(
            "key"
        ) != "compute.googleapis.com/reservation-name" or not values:
            raise _invalid(
                "A SPECIFIC_RESERVATION affinity needs key compute.googleapis.com/reservation-name and a value."
            )
    max_run = max_run_seconds(pool)
    if max_run is not None and max_run <= 0:
        raise _invalid(f"config.maxRunDuration must be positive, got {config.get('maxRunDuration')!r}.")
    if max_run is not None and _capacity_kind(pool) in ("flex-start", "queued") and max_run > FLEX_MAX_RUN_S:
        raise _invalid(
            f"config.maxRunDuration {config.get('maxRunDuration')} exceeds the {FLEX_MAX_RUN_S}s (7 days) that "
            "flex-start and queued provisioning nodes may run."
        )
    if config.get("flexStart"):
        if affinity not in (None, "NO_RESERVATION"):
            raise _invalid("Flex-start node pools cannot consume reservations; set reservationAffinity NO_RESERVATION.")
        if not (pool.get("autoscaling") or {}).get("enabled"):
            raise _invalid("Flex-start node pools need autoscaling enabled.")
    tpu = tpu_machine(machine_type)
    if tpu is None:
        if topology or policy:
            raise _invalid(f'Machine type "{machine_type}" is not a TPU machine type; tpuTopology is not allowed.')
        return None
    fam, per_vm = tpu
    if topology and fam.workload_policy and ptype == "COMPACT":
        raise _invalid(
            f"Placement policy COMPACT is not supported for {machine_type}: multi-host {fam.generation} node pools are "
            "placed with a workload policy (placementPolicy.policyName) or by tpuTopology alone."
        )
    if topology and policy:
        raise _invalid("placementPolicy.tpuTopology and placementPolicy.policyName cannot both be set.")
    if policy and not fam.workload_policy:
        raise _invalid(
            f"placementPolicy.policyName is not supported for {machine_type}; use type COMPACT with tpuTopology."
        )
    if policy:
        if policy not in workload_policies:
            raise _invalid(f'The resource policy "{policy}" was not found in this region.')
        topology = workload_policies[policy]
    if not topology:
        if ptype == "COMPACT":
            raise _invalid(
                f"Placement policy COMPACT without tpuTopology is not supported for single-host TPU node pools "
                f"({machine_type}); remove placementPolicy."
            )
        return fam.single_vm_topology(per_vm)
    if topology not in fam.topologies:
        raise _invalid(
            f'Invalid TPU topology "{topology}" for machine type "{machine_type}". Supported {fam.generation} '
            f"topologies: {', '.join(sorted(fam.topologies, key=lambda t: (chips_in(t), t)))}."
        )
    chips = chips_in(topology)
    if chips % per_vm or chips // per_vm < 2:
        raise _invalid(
            f"Placement policy is not supported for single-host TPU slice node pools: topology {topology} "
            f"({chips} chips) does not span several {machine_type} VMs. Remove placementPolicy for a single-host pool."
        )
    if per_vm != MULTI_HOST_CHIPS_PER_VM:
        raise _invalid(
            f'Machine type "{machine_type}" cannot form TPU topology {topology}: a multi-host slice runs on '
            f"{fam.family}-{MULTI_HOST_CHIPS_PER_VM}t VMs."
        )
    hosts = chips // per_vm
    if ceiling != hosts:
        raise _invalid(
            f"Node count {ceiling} is invalid for TPU topology {topology} with machine type {machine_type}: a "
            f"multi-host TPU slice node pool has exactly {hosts} nodes."
        )
    return topology


def node_labels_of(pool: Mapping[str, Any], tpu_topology: str | None, zone: str) -> dict[str, str]:
    """The Kubernetes labels GKE puts on the pool's nodes."""
    config = pool.get("config") or {}
    labels = dict(config.get("labels") or {})
    labels[GKE_NODEPOOL_LABEL] = pool["name"]
    labels["node.kubernetes.io/instance-type"] = config.get("machineType", "")
    labels["topology.kubernetes.io/zone"] = zone
    tpu = tpu_machine(config.get("machineType", ""))
    if tpu is not None and tpu_topology:
        labels[GKE_ACCELERATOR_LABEL] = tpu[0].accelerator
        labels[GKE_TOPOLOGY_LABEL] = tpu_topology
    kind = _capacity_kind(pool)
    if kind == "spot":
        labels["cloud.google.com/gke-spot"] = "true"
    elif kind == "reservation":
        labels["cloud.google.com/reservation-name"] = str(config["reservationAffinity"]["values"][0]).rsplit("/", 1)[-1]
    elif kind in ("flex-start", "queued"):
        labels["cloud.google.com/gke-flex-start"] = "true"
    return labels


# --- state ------------------------------------------------------------------------------------------
@dataclass
class _Pool:
    cluster: tuple[str, str, str]
    body: dict[str, Any]
    tpu_topology: str | None
    status: str = "PROVISIONING"
    status_message: str = ""
    nodes: int = 0
    bookings: dict[str, int] = field(default_factory=dict)  # queued pools: nodes per ProvisioningRequest
    nodes_since: float | None = None  # monotonic time the pool's nodes started (maxRunDuration counts from it)
    expired: bool = False  # its nodes ran for maxRunDuration and were deleted: nothing schedules on it

    @property
    def name(self) -> str:
        name: str = self.body["name"]  # validated on create (_POOL_NAME_RE)
        return name

    @property
    def zone(self) -> str:
        locations: list[str] = self.body.get("locations") or [self.cluster[1]]
        return locations[0]

    def labels(self) -> dict[str, str]:
        return node_labels_of(self.body, self.tpu_topology, self.zone)

    def to_json(self) -> dict[str, Any]:
        project, location, cluster = self.cluster
        out = copy.deepcopy(self.body)
        out.setdefault("locations", [self.zone])
        out["status"] = self.status
        if self.status_message:
            out["statusMessage"] = self.status_message
        out["selfLink"] = f"{_API}/projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{self.name}"
        out["version"] = "1.34.1-gke.1000"
        return out


@dataclass
class _Operation:
    id: str
    kind: str  # CREATE_NODE_POOL | DELETE_NODE_POOL | UPGRADE_NODES (nodePools.update)
    cluster: tuple[str, str, str]
    pool: str
    done_at: float
    failure: dict[str, Any] | None = None  # error, detail, conditions
    resource_labels: dict[str, str] | None = None  # an update's new resourceLabels, set when it is done
    start_time: str = field(default_factory=_now_iso)
    end_time: str | None = None

    @property
    def done(self) -> bool:
        return self.end_time is not None

    def to_json(self) -> dict[str, Any]:
        project, location, cluster = self.cluster
        out: dict[str, Any] = {
            "name": self.id,
            "zone": location,
            "location": location,
            "operationType": self.kind,
            "status": "DONE" if self.done else "RUNNING",
            "selfLink": f"{_API}/projects/{project}/locations/{location}/operations/{self.id}",
            "targetLink": f"{_API}/projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{self.pool}",
            "startTime": self.start_time,
        }
        if self.done:
            out["endTime"] = self.end_time
        if self.done and self.failure:
            out["error"] = self.failure["error"]
            out["detail"] = self.failure["detail"]
            out["statusMessage"] = self.failure["detail"]
            out["nodepoolConditions"] = self.failure["conditions"]
        return out


def _quota_metric(pool: Mapping[str, Any]) -> str:
    tpu = tpu_machine((pool.get("config") or {}).get("machineType", ""))
    base = tpu[0].accelerator.upper().replace("-", "_") if tpu else "CPUS"
    return ("PREEMPTIBLE_" if _capacity_kind(pool) == "spot" else "") + base


class GKEApiStandin:
    """The stand-in server and its state; every method is thread-safe."""

    def __init__(
        self,
        *,
        operation_seconds: float = 2.0,
        max_concurrent_operations: int = 5,
        clusters: Iterable[str] | None = None,
        workload_policies: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if host not in _LOOPBACK:
            raise ValueError(f"the GKE stand-in only binds loopback, not {host!r}")
        self.operation_seconds = float(operation_seconds)
        self.max_concurrent_operations = int(max_concurrent_operations)
        self._http = LoopbackServer(_Handler, self, host=host, port=port, name="gke-standin")
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._clusters: set[tuple[str, str, str]] | None = None
        if clusters is not None:
            self._clusters = {self._parse_cluster(c) for c in clusters}
        self.workload_policies: dict[str, str] = dict(workload_policies or {})
        self.compute = ComputeResourcePolicies(operation_seconds=self.operation_seconds, in_use=self._pools_using)
        self.quotas = CloudQuotas()
        self._pools: dict[tuple[str, str, str, str], _Pool] = {}
        self._operations: dict[str, _Operation] = {}
        self._faults: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.capacity = CapacitySettings()  # queued / flex-start knobs (tpuflow_rehearsal.standins.capacity)

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> str:
        return self._http.start()

    def stop(self) -> None:
        self._http.stop()

    def __enter__(self) -> GKEApiStandin:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return self._http.url

    def airflow_connection(self, project_id: str | None = None) -> dict[str, Any]:
        """A google_cloud_platform connection (as AIRFLOW_CONN_* JSON) that reaches this stand-in."""
        extra: dict[str, Any] = {
            "is_anonymous": True,
            "container_api_endpoint": self.url,
            "compute_api_endpoint": self.url,
            "quotas_api_endpoint": self.url,
        }
        if project_id:
            extra["project"] = project_id
        return {"conn_type": "google_cloud_platform", "extra": extra}

    # --- control --------------------------------------------------------------------------------
    @staticmethod
    def _parse_cluster(path: str) -> tuple[str, str, str]:
        m = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/clusters/([^/]+)", path)
        if not m:
            raise ValueError(f"a cluster is projects/P/locations/L/clusters/C, not {path!r}")
        return m.group(1), m.group(2), m.group(3)

    def add_cluster(self, path: str) -> None:
        with self._lock:
            if self._clusters is None:
                self._clusters = set()
            self._clusters.add(self._parse_cluster(path))

    def add_workload_policy(self, name: str, accelerator_topology: str) -> None:
        with self._lock:
            self.workload_policies[name] = accelerator_topology

    def add_fault(
        self,
        kind: str,
        *,
        capacity: str | None = None,
        stage: str | None = None,
        on: str = "create",
        times: int = 1,
        message: str | None = None,
        quota_metric: str | None = None,
        seconds: float | None = None,
        zone: str | None = None,
    ) -> dict[str, Any]:
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {kind!r}: use one of {', '.join(FAULT_KINDS)}")
        if capacity is not None and capacity not in CAPACITY_KINDS:
            raise ValueError(f"fault capacity {capacity!r}: use one of {', '.join(CAPACITY_KINDS)}")
        if on not in ("create", "delete"):
            raise ValueError(f"fault on {on!r}: use create or delete")
        default_stage = "operation" if kind in ("stockout", "quota", "stuck") and on == "create" else "request"
        stage = stage or default_stage
        if stage not in ("request", "operation"):
            raise ValueError(f"fault stage {stage!r}: use request or operation")
        if on == "delete" and stage == "operation":
            raise ValueError("delete faults refuse the request (stage request); deletes do not fail mid-operation here")
        if kind == "stuck" and (on, stage) != ("create", "operation"):
            raise ValueError("a stuck fault holds a create's operation: use on create, stage operation")
        if seconds is not None and (kind != "stuck" or not 0 <= float(seconds) < float("inf")):
            raise ValueError(f"fault seconds {seconds!r}: only a stuck fault takes seconds, a finite number >= 0")
        fault: dict[str, Any] = {
            "kind": kind,
            "capacity": capacity,
            "stage": stage,
            "on": on,
            "times": int(times),
            "message": message,
            "quota_metric": quota_metric,
            "zone": zone,
        }
        if kind == "stuck":
            fault["seconds"] = 3600.0 if seconds is None else float(seconds)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self._faults)

    def reset(self) -> None:
        with self._lock:
            self._pools.clear()
            self._operations.clear()
            self._faults.clear()
            self.requests.clear()
        self.compute.reset()
        self.quotas.reset()

    @staticmethod
    def _region(zone: str) -> str:
        return zone.rsplit("-", 1)[0] if zone.count("-") == 2 else zone

    def _workload_policies_for(self, project: str, location: str, pool: Mapping[str, Any]) -> dict[str, str]:
        """Workload policy name -> topology that a pool in this project and region may name."""
        region = self._region((pool.get("locations") or [location])[0])
        policies = dict(self.workload_policies)
        name = (pool.get("placementPolicy") or {}).get("policyName")
        if name:
            topology = self.compute.workload_topology(project, region, name)
            if topology:
                policies[name] = topology
        return policies

    def _pools_using(self, project: str, region: str, policy: str) -> list[str]:
        with self._lock:
            return [
                p.body["name"]
                for p in self._pools.values()
                if p.cluster[0] == project
                and self._region(p.zone) == region
                and (p.body.get("placementPolicy") or {}).get("policyName") == policy
            ]

    def _take_fault(self, on: str, capacity: str, zone: str | None = None) -> dict[str, Any] | None:
        for fault in self._faults:
            if fault["on"] == on and fault["capacity"] in (None, capacity) and fault.get("zone") in (None, zone):
                fault["times"] -= 1
                if fault["times"] <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    # --- queries (also for the simulated KubeRay controller) ------------------------------------------
    def node_pools(self, cluster: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            self._tick()
            wanted = self._parse_cluster(cluster) if cluster else None
            return [
                {
                    **p.to_json(),
                    "nodeLabels": p.labels(),
                    "nodeCount": p.nodes,
                    "cluster": "projects/{}/locations/{}/clusters/{}".format(*p.cluster),
                    "capacity": _capacity_kind(p.body),
                    "maxNodeCount": _node_count(p.body)[1],
                    "bookings": dict(p.bookings),
                }
                for p in self._pools.values()
                if wanted is None or p.cluster == wanted
            ]

    def set_nodes(self, cluster: str, name: str, nodes: int | None = None, *, consumer: str | None = None) -> None:
        """The simulated autoscaler's hand (tpuflow_rehearsal.standins.capacity): resize an autoscaled pool, or book
        (``nodes`` > 0) / release (``nodes`` None or 0) the nodes of a ProvisioningRequest on a queued pool."""
        with self._lock:
            pool = self._pools.get((*self._parse_cluster(cluster), name))
            if pool is None or pool.status != "RUNNING" or _capacity_kind(pool.body) not in ("flex-start", "queued"):
                return
            ceiling = _node_count(pool.body)[1]
            if consumer is None:
                pool.nodes = max(0, min(int(nodes or 0), ceiling))
                return
            if nodes:
                pool.bookings[consumer] = int(nodes)
            else:
                pool.bookings.pop(consumer, None)
            pool.nodes = min(sum(pool.bookings.values()), ceiling)

    def find_node_pools(
        self, node_selector: Mapping[str, str], nodes: int = 1, *, cluster: str | None = None
    ) -> list[dict[str, Any]]:
        """RUNNING pools whose node labels include node_selector and that have (or can scale to) `nodes` nodes."""
        with self._lock:
            self._tick()
            wanted = self._parse_cluster(cluster) if cluster else None
            matches = []
            for pool in self._pools.values():
                if pool.status != "RUNNING" or pool.expired or (wanted is not None and pool.cluster != wanted):
                    continue
                labels = pool.labels()
                if any(labels.get(k) != str(v) for k, v in node_selector.items()):
                    continue
                _, ceiling = _node_count(pool.body)
                if max(pool.nodes, ceiling) < nodes:
                    continue
                project, location, cluster_name = pool.cluster
                matches.append(
                    {
                        "name": pool.name,
                        "cluster": f"projects/{project}/locations/{location}/clusters/{cluster_name}",
                        "nodeCount": pool.nodes,
                        "maxNodeCount": ceiling,
                        "labels": labels,
                    }
                )
            return matches

    def state(self) -> dict[str, Any]:
        with self._lock:
            self._tick()
            return {
                "nodePools": self.node_pools(),
                "operations": [op.to_json() for op in self._operations.values()],
                "faults": copy.deepcopy(self._faults),
                "workloadPolicies": dict(self.workload_policies),
                "resourcePolicies": self.compute.policies(),
                "operationSeconds": self.operation_seconds,
                "maxConcurrentOperations": self.max_concurrent_operations,
            }

    # --- the GKE API ---------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.monotonic()
        for op in self._operations.values():
            if op.done or now < op.done_at:
                continue
            op.end_time = _now_iso()
            key = (*op.cluster, op.pool)
            pool = self._pools.get(key)
            if op.kind == "DELETE_NODE_POOL":
                self._pools.pop(key, None)
            elif op.kind == "UPGRADE_NODES":
                if pool is not None and op.resource_labels is not None:
                    config = pool.body.setdefault("config", {})
                    config["resourceLabels"] = dict(op.resource_labels)
                    if not op.resource_labels:
                        config.pop("resourceLabels")
            elif pool is not None and op.failure:
                pool.status, pool.status_message, pool.nodes = "ERROR", op.failure["detail"], 0
            elif pool is not None:
                pool.status, pool.nodes = "RUNNING", _node_count(pool.body)[0]
        for pool in self._pools.values():
            self._expire_nodes(pool, now)

    @staticmethod
    def _expire_nodes(pool: _Pool, now: float) -> None:
        """GKE deletes a node once it has run for its pool's maxRunDuration, whoever else is up or down."""
        if pool.nodes <= 0:
            pool.nodes_since = None
            return
        if pool.nodes_since is None:
            pool.nodes_since = now
        limit = max_run_seconds(pool.body)
        if limit is not None and now - pool.nodes_since >= limit:
            pool.nodes, pool.nodes_since, pool.bookings, pool.expired = 0, None, {}, True
            pool.status_message = (
                f"The nodes ran for maxRunDuration ({pool.body['config']['maxRunDuration']}) and were deleted."
            )

    def _cluster(self, project: str, location: str, cluster: str) -> tuple[str, str, str]:
        key = (project, location, cluster)
        if self._clusters is not None and key not in self._clusters:
            raise ApiError(404, "NOT_FOUND", f"Not found: projects/{project}/locations/{location}/clusters/{cluster}.")
        return key

    def _busy_check(self, key: tuple[str, str, str]) -> None:
        running = sum(1 for op in self._operations.values() if op.cluster == key and not op.done)
        if running >= self.max_concurrent_operations:
            raise self._too_many(key)

    def _too_many(self, key: tuple[str, str, str]) -> ApiError:
        return ApiError(
            429,
            "RESOURCE_EXHAUSTED",
            f'Too many operations: cluster "{key[2]}" hits the concurrent operations quota '
            f"{self.max_concurrent_operations}, please try again later.",
        )

    def _request_fault(self, fault: Mapping[str, Any], key: tuple[str, str, str], pool: Mapping[str, Any]) -> ApiError:
        project, location, cluster = key
        kind, message = fault["kind"], fault.get("message")
        if kind == "too_many_operations":
            err = self._too_many(key)
            err.message = message or err.message
            return err
        if kind == "permission":
            return ApiError(
                403,
                "PERMISSION_DENIED",
                message
                or (
                    f'Required "container.clusters.update" permission(s) for '
                    f'"projects/{project}/locations/{location}/clusters/{cluster}".'
                ),
            )
        if kind == "quota":
            metric = fault.get("quota_metric") or _quota_metric(pool)
            return ApiError(
                403,
                "PERMISSION_DENIED",
                message
                or (
                    f"Insufficient quota to satisfy the request: Quota '{metric}' exceeded.  Limit: 0.0 in zone {location}."
                ),
            )
        if kind == "stockout":
            return ApiError(
                503,
                "UNAVAILABLE",
                message
                or (
                    f"ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'projects/{project}/zones/{location}' does not have enough "
                    "resources available to fulfill the request. Try a different zone, or try again later."
                ),
            )
        if kind == "already_exists":
            return ApiError(
                409,
                "ALREADY_EXISTS",
                message
                or (
                    f"Already exists: projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{pool.get('name')}."
                ),
            )
        if kind == "invalid_argument":
            return _invalid(message or "Invalid request (injected by the stand-in).")
        return ApiError(500, "INTERNAL", message or "Internal error (injected by the stand-in).")

    def _operation_failure(
        self, fault: Mapping[str, Any], key: tuple[str, str, str], pool: Mapping[str, Any]
    ) -> dict[str, Any]:
        project, location, cluster = key
        zone = (pool.get("locations") or [location])[0]
        nodes = max(_node_count(pool)[0], 1)
        instance = f"gke-{cluster}-{pool['name']}-{next(self._ids):08x}"[:60]
        if fault["kind"] == "stockout":
            code, condition = 8, "GCE_STOCKOUT"
            message = fault.get("message") or (
                f"Instance '{instance}' creation failed: The zone 'projects/{project}/zones/{zone}' does not have "
                "enough resources available to fulfill the request.  '(resource type:compute)'."
            )
            summary = ""
        elif fault["kind"] == "quota":
            code, condition = 8, "GCE_QUOTA_EXCEEDED"
            metric = fault.get("quota_metric") or _quota_metric(pool)
            message = fault.get("message") or (
                f"Instance '{instance}' creation failed: Quota '{metric}' exceeded.  Limit: 0.0 in zone {zone}."
            )
            summary = "Insufficient quota to satisfy the request: "
        else:
            code, condition = 13, "UNKNOWN"
            message = fault.get("message") or f"Operation failed ({fault['kind']}, injected by the stand-in)."
            summary = ""
        detail = (
            f"{summary}Not all instances running in IGM after {self.operation_seconds:.1f}s. Expected {nodes}, "
            f"running 0, transitioning {nodes}. Current errors: [{condition}]: {message}"
        )
        canonical = "RESOURCE_EXHAUSTED" if code == 8 else "INTERNAL"
        return {
            "error": {"code": code, "message": message},
            "detail": detail,
            "conditions": [{"code": condition, "message": message, "canonicalCode": canonical}],
        }

    def _new_operation(
        self, kind: str, key: tuple[str, str, str], pool: str, failure: dict[str, Any] | None = None
    ) -> _Operation:
        op_id = f"operation-{int(time.time() * 1000)}-{next(self._ids):08x}"
        op = _Operation(op_id, kind, key, pool, time.monotonic() + self.operation_seconds, failure)
        self._operations[op_id] = op
        return op

    def create_node_pool(self, project: str, location: str, cluster: str, body: Mapping[str, Any]) -> dict[str, Any]:
        pool = _parse_node_pool(body)
        with self._lock:
            self._tick()
            key = self._cluster(project, location, cluster)
            fault = self._take_fault("create", _capacity_kind(pool), (pool.get("locations") or [location])[0])
            if fault is not None and fault["stage"] == "request":
                raise self._request_fault(fault, key, pool)
            self._busy_check(key)
            name = pool.get("name", "")
            if (*key, name) in self._pools:
                raise ApiError(
                    409,
                    "ALREADY_EXISTS",
                    (f"Already exists: projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{name}."),
                )
            topology = validate_node_pool(pool, self._workload_policies_for(project, location, pool))
            stuck_for = fault["seconds"] if fault is not None and fault["kind"] == "stuck" else None
            failure = self._operation_failure(fault, key, pool) if fault is not None and stuck_for is None else None
            self._pools[(*key, name)] = _Pool(key, pool, topology)
            op = self._new_operation("CREATE_NODE_POOL", key, name, failure)
            if stuck_for is not None:
                op.done_at = time.monotonic() + stuck_for
            return op.to_json()

    def delete_node_pool(self, project: str, location: str, cluster: str, name: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            key = self._cluster(project, location, cluster)
            pool = self._pools.get((*key, name))
            fault = self._take_fault(
                "delete", _capacity_kind(pool.body) if pool else "on-demand", pool.zone if pool else location
            )
            if fault is not None:
                raise self._request_fault(fault, key, pool.body if pool else {"name": name})
            pool = self._existing_pool(key, name, pool)
            self._refuse_while_running(key, name)
            self._busy_check(key)
            pool.status = "STOPPING"
            return self._new_operation("DELETE_NODE_POOL", key, name).to_json()

    def _existing_pool(self, key: tuple[str, str, str], name: str, pool: _Pool | None = None) -> _Pool:
        """The pool `name` of cluster `key` (`pool`: already looked up), or GKE's 404."""
        pool = pool or self._pools.get((*key, name))
        if pool is None:
            project, location, cluster = key
            raise ApiError(
                404,
                "NOT_FOUND",
                f"Not found: projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{name}.",
            )
        return pool

    def _refuse_while_running(self, key: tuple[str, str, str], name: str) -> None:
        """GKE runs one operation at a time on a node pool."""
        running = next(
            (op for op in self._operations.values() if op.cluster == key and op.pool == name and not op.done), None
        )
        if running is not None:
            verb = {"CREATE_NODE_POOL": "creating", "DELETE_NODE_POOL": "deleting"}.get(running.kind, "updating")
            raise ApiError(
                400,
                "FAILED_PRECONDITION",
                (
                    f"Operation {running.id} is currently {verb} node pool {name} for cluster {key[2]}. "
                    "Please wait and try again once it is done."
                ),
            )

    def update_node_pool(
        self, project: str, location: str, cluster: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """nodePools.update with resourceLabels (the whole new set); other update fields are refused."""
        labels = _parse_resource_labels_update(body)
        with self._lock:
            self._tick()
            key = self._cluster(project, location, cluster)
            pool = self._existing_pool(key, name)
            self._refuse_while_running(key, name)
            if pool.status != "RUNNING":
                raise ApiError(
                    400,
                    "FAILED_PRECONDITION",
                    f"Node pool {name} is {pool.status}; it can be updated only when it is RUNNING.",
                )
            self._busy_check(key)
            op = self._new_operation("UPGRADE_NODES", key, name)
            op.resource_labels = labels
            return op.to_json()

    def get_node_pool(self, project: str, location: str, cluster: str, name: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            key = self._cluster(project, location, cluster)
            return self._existing_pool(key, name).to_json()

    def list_node_pools(self, project: str, location: str, cluster: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            key = self._cluster(project, location, cluster)
            return {"nodePools": [p.to_json() for p in self._pools.values() if p.cluster == key]}

    def get_cluster(self, project: str, location: str, cluster: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            key = self._cluster(project, location, cluster)
            return {
                "name": cluster,
                "location": location,
                "status": "RUNNING",
                "selfLink": f"{_API}/projects/{project}/locations/{location}/clusters/{cluster}",
                "nodePools": [p.to_json() for p in self._pools.values() if p.cluster == key],
            }

    def get_operation(self, project: str, location: str, op_id: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            op = self._operations.get(op_id)
            if op is None or op.cluster[:2] != (project, location):
                raise ApiError(
                    404, "NOT_FOUND", f"Not found: projects/{project}/locations/{location}/operations/{op_id}."
                )
            return op.to_json()

    def list_operations(self, project: str, location: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            return {
                "operations": [
                    op.to_json() for op in self._operations.values() if op.cluster[:2] == (project, location)
                ]
            }


def _parse_node_pool(body: Any) -> dict[str, Any]:
    """Read a CreateNodePoolRequest body the way GKE does: unknown fields and bad values are 400s."""
    from google.cloud.container_v1.types import NodePool

    if not isinstance(body, Mapping) or not isinstance(body.get("nodePool"), Mapping):
        raise _invalid("Invalid JSON payload: the request needs a nodePool object.")
    try:
        message = NodePool.from_json(json.dumps(body["nodePool"]))
    except Exception as err:  # json_format.ParseError and friends
        raise _invalid(f"Invalid JSON payload received. {err}") from err
    # Enum values arrive as numbers from the Python client; keep names, as GKE's own JSON does.
    parsed: dict[str, Any] = json.loads(
        NodePool.to_json(message, use_integers_for_enums=False, always_print_fields_with_no_presence=False, indent=None)
    )
    if not parsed.get("name"):
        raise _invalid("nodePool.name is required.")
    return parsed


def _parse_resource_labels_update(body: Any) -> dict[str, str]:
    """Read an UpdateNodePoolRequest body the way GKE does (unknown fields and bad values are 400s); the
    stand-in serves only resourceLabels, so any other update field is a 400 too."""
    from google.cloud.container_v1.types import UpdateNodePoolRequest

    if not isinstance(body, Mapping):
        raise _invalid("Invalid JSON payload: the request needs an UpdateNodePoolRequest object.")
    try:
        UpdateNodePoolRequest.from_json(json.dumps(body))
    except Exception as err:  # json_format.ParseError and friends
        raise _invalid(f"Invalid JSON payload received. {err}") from err
    others = sorted(k for k, v in body.items() if k not in _UPDATE_IDENTITY_FIELDS | {"resourceLabels"} and v)
    if others:
        raise _invalid(
            f"The GKE stand-in updates only resourceLabels of a node pool; this request also sets {', '.join(others)}."
        )
    if "resourceLabels" not in body:
        raise _invalid("At least one field must be updated: the stand-in serves resourceLabels updates.")
    labels = (body.get("resourceLabels") or {}).get("labels") or {}
    if len(labels) > _MAX_GCE_LABELS:
        raise _invalid(f"Invalid resourceLabels: at most {_MAX_GCE_LABELS} labels, got {len(labels)}.")
    for key, value in labels.items():
        if not _GCE_LABEL_KEY_RE.match(key) or not _GCE_LABEL_VALUE_RE.match(str(value)):
            raise _invalid(
                f'Invalid resourceLabels entry "{key}": "{value}": keys start with a lowercase letter, keys and '
                "values are at most 63 lowercase letters, digits, underscores and dashes."
            )
    return {str(k): str(v) for k, v in labels.items()}


# --- HTTP --------------------------------------------------------------------------------------------
_PREFIX = r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
_ROUTES = [
    (re.compile(_PREFIX + r"/clusters/(?P<cluster>[^/]+)/nodePools/(?P<pool>[^/]+)$"), "pool"),
    (re.compile(_PREFIX + r"/clusters/(?P<cluster>[^/]+)/nodePools$"), "pools"),
    (re.compile(_PREFIX + r"/clusters/(?P<cluster>[^/]+)$"), "cluster"),
    (re.compile(_PREFIX + r"/operations/(?P<op>[^/]+)$"), "operation"),
    (re.compile(_PREFIX + r"/operations$"), "operations"),
]


class _Handler(LoopbackHandler):
    def _body(self) -> Any:
        return self.parse_body(_not_json)

    def _handle(self) -> None:
        standin = self.server.standin
        path = urlsplit(self.path).path
        try:
            body = self._body() if self.command in ("POST", "PUT", "PATCH") else None
            if not path.startswith("/_standin/"):
                with standin._lock:
                    standin.requests.append({"method": self.command, "path": path, "body": body})
            quota_answer = standin.quotas.handle(self.command, path)
            if quota_answer is not None:
                code, payload = quota_answer
            elif path.startswith(COMPUTE_PREFIX):
                code, payload = standin.compute.handle(self.command, path, body)
            else:
                code, payload = (
                    200,
                    (self._control(path, body) if path.startswith("/_standin/") else self._api(path, body)),
                )
        except ApiError as err:
            code, payload = err.code, err.body()
        except (ValueError, KeyError, TypeError) as err:
            code, payload = 400, {"error": {"code": 400, "message": str(err), "status": "INVALID_ARGUMENT"}}
        except Exception as err:  # a stand-in bug: answer like a broken server
            code, payload = 500, {"error": {"code": 500, "message": f"stand-in error: {err!r}", "status": "INTERNAL"}}
        self.send_body(code, payload, "application/json; charset=UTF-8")

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def _api(self, path: str, body: Any) -> Any:
        gke = self.server.standin
        for pattern, what in _ROUTES:
            m = pattern.match(path)
            if not m:
                continue
            p = m.groupdict()
            method = self.command
            if what == "pool" and method == "GET":
                return gke.get_node_pool(p["project"], p["location"], p["cluster"], p["pool"])
            if what == "pool" and method == "DELETE":
                return gke.delete_node_pool(p["project"], p["location"], p["cluster"], p["pool"])
            if what == "pool" and method == "PUT":
                return gke.update_node_pool(p["project"], p["location"], p["cluster"], p["pool"], body)
            if what == "pools" and method == "GET":
                return gke.list_node_pools(p["project"], p["location"], p["cluster"])
            if what == "pools" and method == "POST":
                return gke.create_node_pool(p["project"], p["location"], p["cluster"], body)
            if what == "cluster" and method == "GET":
                return gke.get_cluster(p["project"], p["location"], p["cluster"])
            if what == "operation" and method == "GET":
                return gke.get_operation(p["project"], p["location"], p["op"])
            if what == "operations" and method == "GET":
                return gke.list_operations(p["project"], p["location"])
            raise ApiError(405, "METHOD_NOT_ALLOWED", f"{method} is not supported on {path}.")
        raise ApiError(404, "NOT_FOUND", f"The stand-in does not serve {path}.")

    def _control(self, path: str, body: Any) -> Any:
        gke = self.server.standin
        method = self.command
        body = body or {}
        if not isinstance(body, dict):
            raise ValueError(f"the request body must be a JSON object, not {type(body).__name__}")
        if path == "/_standin/health":
            return {"status": "ok"}
        if path == "/_standin/faults":
            if method == "POST":
                items = body.get("faults", [body] if "kind" in body else [])
                return {"queued": [gke.add_fault(**_fault_kwargs(f)) for f in items]}
            if method == "DELETE":
                gke.clear_faults()
                return {"faults": []}
            return {"faults": gke.faults()}
        if path == "/_standin/match" and method == "POST":
            selector = body.get("nodeSelector") or {}
            return {"matches": gke.find_node_pools(selector, int(body.get("nodes", 1)), cluster=body.get("cluster"))}
        if path == "/_standin/workload-policies" and method == "POST":
            gke.add_workload_policy(body["name"], body["acceleratorTopology"])
            return {"workloadPolicies": dict(gke.workload_policies)}
        if path == "/_standin/clusters" and method == "POST":
            gke.add_cluster(body["name"])
            return {"added": body["name"]}
        if path == "/_standin/config" and method == "POST":
            with gke._lock:
                if "operationSeconds" in body:
                    seconds = float(body["operationSeconds"])
                    if not 0 <= seconds < float("inf"):
                        raise ValueError(f"operationSeconds must be a finite number >= 0, not {seconds}")
                    gke.operation_seconds = gke.compute.operation_seconds = seconds
                if "maxConcurrentOperations" in body:
                    gke.max_concurrent_operations = int(body["maxConcurrentOperations"])
            return {"operationSeconds": gke.operation_seconds, "maxConcurrentOperations": gke.max_concurrent_operations}
        if path == "/_standin/quotas" and method == "POST":
            gke.quotas.set(body["quotaId"], int(body["value"]), **(body.get("dimensions") or {}))
            return {"quotaInfo": gke.quotas.info("-", "compute.googleapis.com", body["quotaId"])}
        if path == "/_standin/capacity":
            with gke._lock:
                return gke.capacity.update(body) if method == "POST" else gke.capacity.to_dict()
        if path == "/_standin/nodes" and method == "POST":
            gke.set_nodes(body["cluster"], body["name"], body.get("nodes"), consumer=body.get("consumer"))
            return {"nodePools": gke.node_pools(body["cluster"])}
        if path == "/_standin/state" and method == "GET":
            return gke.state()
        if path == "/_standin/requests" and method == "GET":
            with gke._lock:
                return {"requests": copy.deepcopy(gke.requests)}
        if path == "/_standin/reset" and method == "POST":
            gke.reset()
            return {"reset": True}
        raise ApiError(404, "NOT_FOUND", f"No stand-in control path {method} {path}.")


def _not_json(raw: bytes, err: ValueError) -> Any:
    raise _invalid(f"Invalid JSON payload received. {err}") from err


def _fault_kwargs(item: Mapping[str, Any]) -> dict[str, Any]:
    allowed = {"kind", "capacity", "stage", "on", "times", "message", "quota_metric", "seconds", "zone"}
    unknown = set(item) - allowed - {"quotaMetric"}
    if unknown:
        raise ValueError(f"unknown fault fields {sorted(unknown)}; use {sorted(allowed)}")
    kwargs = {k: v for k, v in item.items() if k in allowed}
    if "quotaMetric" in item:
        kwargs["quota_metric"] = item["quotaMetric"]
    return kwargs


# --- shell ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuflow_rehearsal.standins.gke_api", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (0: pick a free one)")
    parser.add_argument("--operation-seconds", type=float, default=2.0, help="time each operation takes")
    parser.add_argument("--max-concurrent-operations", type=int, default=5, help="per cluster, like GKE")
    parser.add_argument(
        "--cluster",
        action="append",
        default=None,
        help="projects/P/locations/L/clusters/C that exists (repeat; default: any cluster exists)",
    )
    parser.add_argument(
        "--workload-policy",
        action="append",
        default=[],
        metavar="NAME=TOPOLOGY",
        help="a workload policy for multi-host tpu7x pools, e.g. wp-2x2x2=2x2x2 (repeat)",
    )
    args = parser.parse_args(argv)
    policies = {}
    for item in args.workload_policy:
        name, sep, topology = item.partition("=")
        if not sep:
            parser.error(f"--workload-policy {item!r}: write NAME=TOPOLOGY")
        policies[name] = topology
    standin = GKEApiStandin(
        operation_seconds=args.operation_seconds,
        max_concurrent_operations=args.max_concurrent_operations,
        clusters=args.cluster,
        workload_policies=policies,
        host=args.host,
        port=args.port,
    )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    print(standin.start(), flush=True)
    try:
        stopped.wait()
    finally:
        standin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
