"""What a TPU slice node pool looks like on the GKE API, built and checked without touching the API.

Pure module (no google-cloud imports): the operators, the `tpuflow render nodepool` command and the
GKE stand-in all derive the request body from here, so what is rendered is what is sent. Bodies use
the GKE v1 REST/JSON form (camelCase field names, enum values by name).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuflow.errors import UserInputError
from tpuflow.gke.workload_policy import WorkloadPolicyPlan, plan_workload_policy
from tpuflow.labels import check_label_key, check_label_value, check_labels, gce_ownership_labels
from tpuflow.naming import (
    NODE_POOL_NAME_MAX,
    TaskIdentity,
    check_cluster_location,
    check_cluster_name,
    check_node_pool_name,
    check_project,
    dns_name,
    is_zone,
    run_key,
)
from tpuflow.tpu import TpuSlice
from tpuflow.tpu.slice_argument import FIELD as SLICE_FIELD
from tpuflow.tpu.slice_argument import resolve_slice
from tpuflow.validation import check_whole_seconds

RESERVATION_KEY = "compute.googleapis.com/reservation-name"

_GCE_NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_SHARED_RESERVATION_RE = re.compile(r"^projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/reservations/(?P<name>[^/]+)$")
_EMAIL_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]*@[a-z0-9-]+(\.[a-z0-9-]+)+$")

# GKE taint effects by name; Kubernetes spellings are accepted too.
_TAINT_EFFECTS = {
    "NO_SCHEDULE": "NO_SCHEDULE",
    "NOSCHEDULE": "NO_SCHEDULE",
    "PREFER_NO_SCHEDULE": "PREFER_NO_SCHEDULE",
    "PREFERNOSCHEDULE": "PREFER_NO_SCHEDULE",
    "NO_EXECUTE": "NO_EXECUTE",
    "NOEXECUTE": "NO_EXECUTE",
}
# Node label prefixes GKE owns; GKE rejects pools that try to set them.
_RESERVED_LABEL_PREFIXES = ("cloud.google.com/", "kubernetes.io/", "k8s.io/", "node.kubernetes.io/")

# GKE runs flex-start (queued provisioning included) VMs for at most seven days, also their default.
FLEX_MAX_RUN_DURATION_S = 7 * 24 * 3600

CAPACITY_KINDS = ("on-demand", "spot", "reservation", "flex-start", "queued")
_CAPACITY_FORMS = "on-demand, spot, reservation:NAME, flex-start or queued"
_CAPACITY_HINTS = {
    "preemptible": "preemptible VMs are retired for TPUs; use spot",
    "ondemand": "write on-demand",
    "on_demand": "write on-demand",
    "standard": "write on-demand",
    "flex": "write flex-start",
    "flexstart": "write flex-start",
    "dws": "write flex-start (or queued for queued provisioning)",
    "queued-provisioning": "write queued",
}


# --- capacity ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Capacity:
    """Where the TPU VMs come from: on-demand, spot, a specific reservation, flex-start or queued."""

    kind: str
    reservation: str | None = None

    def __str__(self) -> str:
        return f"reservation:{self.reservation}" if self.kind == "reservation" else self.kind

    @property
    def autoscaled(self) -> bool:
        """Flex-start and queued pools start empty and scale up to the slice when a workload asks."""
        return self.kind in ("flex-start", "queued")


def parse_capacity(value: object, field_name: str = "capacity") -> Capacity:
    if isinstance(value, Capacity):
        return value
    text = str(value or "").strip()
    kind, sep, rest = text.partition(":")
    kind = kind.strip().lower()
    if kind == "reservation":
        name = rest.strip()
        if not name:
            raise UserInputError(
                field_name,
                value,
                "a reservation needs its name: write reservation:NAME "
                "(or reservation:projects/OWNER_PROJECT/reservations/NAME for a shared reservation)",
            )
        shared = _SHARED_RESERVATION_RE.match(name)
        if not _GCE_NAME_RE.match(shared.group("name") if shared else name):
            raise UserInputError(
                field_name,
                value,
                "a reservation name is lowercase letters, digits and hyphens, starts with a "
                "letter and has at most 63 characters",
            )
        return Capacity("reservation", name)
    if sep:
        raise UserInputError(field_name, value, f"only reservation takes a ':NAME' part; use one of {_CAPACITY_FORMS}")
    if kind in CAPACITY_KINDS:
        return Capacity(kind)
    hint = _CAPACITY_HINTS.get(kind)
    raise UserInputError(field_name, value, f"{hint + '; ' if hint else ''}use one of {_CAPACITY_FORMS}")


def parse_capacity_order(capacity: object, fallback: object = ()) -> tuple[Capacity, ...]:
    """The capacity to try first, then the fallbacks in order (a list or a comma-separated string)."""
    first = parse_capacity(capacity, "capacity")
    if isinstance(fallback, str):
        items: Iterable[object] = [p for p in fallback.split(",") if p.strip()]
    elif not fallback:
        items = ()
    elif isinstance(fallback, Iterable):
        items = fallback
    else:
        raise UserInputError(
            "fallback_capacity", fallback, f"give a list or a comma-separated string of {_CAPACITY_FORMS}"
        )
    order = [first]
    for item in items:
        cap = parse_capacity(item, "fallback_capacity")
        if cap in order:
            raise UserInputError("fallback_capacity", fallback, f"{cap} is listed twice; list each capacity once")
        order.append(cap)
    return tuple(order)


# --- names and places (the name rules live in tpuflow.naming, cheap to load at parse time) ------------
def check_location(location: str, node_zone: str | None = None) -> tuple[str, str]:
    """The cluster location (zone or region) and the zone the slice's VMs go in."""
    check_cluster_location(location)
    if node_zone is not None and not (isinstance(node_zone, str) and is_zone(node_zone)):
        raise UserInputError("node_zone", node_zone, "give a zone like us-east5-b; a TPU slice lives in one zone")
    if is_zone(location):
        if node_zone and node_zone != location:
            raise UserInputError(
                "node_zone",
                node_zone,
                f"a zonal cluster in {location} can only place nodes in {location}; drop node_zone",
            )
        return location, location
    if not node_zone:
        raise UserInputError(
            "node_zone", node_zone, f"{location} is a region: name the zone of the slice too, e.g. {location}-b"
        )
    if not node_zone.startswith(location + "-"):
        raise UserInputError("node_zone", node_zone, f"pick a zone of the cluster's region {location}")
    return location, node_zone


ZONE_FAILOVER_ORDERS = ("zone-first", "capacity-first")


def check_zones(location: str, node_zone: object) -> tuple[str, tuple[str, ...]]:
    """The cluster location and the zones to try in order: ``node_zone`` is one zone, or several (a list, or
    a comma-separated string) of a regional cluster's region."""
    if isinstance(node_zone, str) and "," in node_zone:
        items: list[object] = [z.strip() for z in node_zone.split(",") if z.strip()]
    elif isinstance(node_zone, list | tuple):
        items = list(node_zone)
    else:
        location, zone = check_location(location, node_zone or None)  # type: ignore[arg-type]
        return location, (zone,)
    if not items:
        location, zone = check_location(location, None)
        return location, (zone,)
    zones = tuple(check_location(location, item)[1] for item in items)  # type: ignore[arg-type]
    if len(set(zones)) != len(zones):
        raise UserInputError("node_zone", node_zone, "name each zone once, in the order to try them")
    return location, zones


def check_zone_failover(value: object) -> str:
    if value not in ZONE_FAILOVER_ORDERS:
        raise UserInputError(
            "zone_failover",
            value,
            "use zone-first (every zone with the first capacity, then the next capacity) or capacity-first "
            "(every capacity in the first zone, then the next zone)",
        )
    return str(value)


def node_pool_names(
    tpu: TpuSlice, *, identity: TaskIdentity | None = None, explicit: str | None = None
) -> tuple[str, ...]:
    """One pool per multi-host slice (GKE cannot grow a multi-host pool); one pool for single-host slices.

    The name derives from the task instance (dag id, run id, task id, map index), never the try number,
    so a retried task finds the pool its earlier try created.
    """
    count = tpu.num_slices if tpu.multi_host else 1
    if explicit:
        check_node_pool_name(explicit)
        if count == 1:
            return (explicit,)
        names = tuple(f"{explicit}-s{i}" for i in range(count))
        if len(names[-1]) > NODE_POOL_NAME_MAX:
            raise UserInputError(
                "node_pool_name",
                explicit,
                f"{count} slices need the suffixes -s0..-s{count - 1}; shorten the name to "
                f"{NODE_POOL_NAME_MAX - len(names[-1]) + len(explicit)} characters",
            )
        return names
    readable: tuple[str, ...]
    if identity is None:
        readable = ("tpuflow", tpu.generation.name, tpu.topology)
        key = run_key("render", tpu.generation.name, tpu.topology)
    else:
        readable = (identity.task_id,)
        key = identity.key
    if count == 1:
        return (dns_name(*readable, key=key, max_len=NODE_POOL_NAME_MAX),)
    return tuple(dns_name(*readable, key=f"{key}-s{i}", max_len=NODE_POOL_NAME_MAX) for i in range(count))


# --- node configuration --------------------------------------------------------------------------------
def check_node_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """Kubernetes labels for the nodes (tpuflow.labels rules), none under a prefix GKE owns."""
    checked = check_labels("node_labels", labels or None)
    for key in checked:
        if key.startswith(_RESERVED_LABEL_PREFIXES):
            raise UserInputError(
                "node_labels",
                key,
                "this key is set by GKE itself (the TPU labels come from the slice); "
                "use your own prefix, e.g. example.com/team",
            )
    return checked


def _parse_taint(item: object) -> dict[str, str]:
    if isinstance(item, str):
        m = re.fullmatch(r"\s*([^=:\s]+)(?:=([^:\s]*))?:(\w+)\s*", item)
        if not m:
            raise UserInputError("node_taints", item, "write a taint as KEY=VALUE:EFFECT, e.g. team=ml:NoSchedule")
        key, value, effect = m.group(1), m.group(2) or "", m.group(3)
    elif isinstance(item, Mapping):
        key, value, effect = item.get("key"), item.get("value", "") or "", item.get("effect", "")
    else:
        raise UserInputError("node_taints", item, "give each taint as KEY=VALUE:EFFECT or {key, value, effect}")
    check_label_key("node_taints", key)
    canonical = _TAINT_EFFECTS.get(str(effect).replace("-", "").upper().replace("_", "")) or _TAINT_EFFECTS.get(
        str(effect).upper()
    )
    if canonical is None:
        raise UserInputError("node_taints", item, "the effect is NoSchedule, PreferNoSchedule or NoExecute")
    return {"key": str(key), "value": check_label_value("node_taints", value, str(key)), "effect": canonical}


def check_node_taints(taints: Sequence[object] | str | None) -> list[dict[str, str]]:
    if not taints:
        return []
    items = [t for t in taints.split(",") if t.strip()] if isinstance(taints, str) else list(taints)
    return [_parse_taint(t) for t in items]


def check_service_account(service_account: str | None) -> str | None:
    if service_account in (None, ""):
        return None
    if not isinstance(service_account, str) or not _EMAIL_RE.match(service_account):
        raise UserInputError(
            "service_account",
            service_account,
            "give the node service account's email, e.g. tpu-nodes@PROJECT.iam.gserviceaccount.com",
        )
    return service_account


# --- the request ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodePoolPlan:
    """Everything needed to create (or recognise) the node pools of one slice request."""

    project_id: str
    location: str
    cluster_name: str
    node_zone: str
    tpu: TpuSlice
    capacities: tuple[Capacity, ...]
    names: tuple[str, ...]
    node_labels: dict[str, str] = field(default_factory=dict)
    node_taints: tuple[dict[str, str], ...] = ()
    service_account: str | None = None
    workload_policy: str | None = None
    resource_labels: dict[str, str] = field(default_factory=dict)
    made_workload_policy: WorkloadPolicyPlan | None = None  # the task makes it: no workload_policy was given
    # NodeConfig.maxRunDuration: GKE deletes each node this long after it started, whatever Airflow does
    max_run_duration_s: int | None = None
    # the zones to try, in order (node_zone is the first); on a stockout or a quota error the next choice
    zones: tuple[str, ...] = ()
    zone_failover: str = "zone-first"

    @property
    def choices(self) -> tuple[tuple[str, Capacity], ...]:
        """Every (zone, capacity) to try, in order: zone-first tries each zone before the next capacity."""
        zones = self.zones or (self.node_zone,)
        if self.zone_failover == "capacity-first":
            return tuple((zone, cap) for zone in zones for cap in self.capacities)
        return tuple((zone, cap) for cap in self.capacities for zone in zones)

    def max_run_duration(self, capacity: Capacity) -> int | None:
        """The pool's maxRunDuration with ``capacity``: flex-start and queued nodes live seven days at most."""
        if self.max_run_duration_s is None or not capacity.autoscaled:
            return self.max_run_duration_s
        return min(self.max_run_duration_s, FLEX_MAX_RUN_DURATION_S)

    @property
    def parent(self) -> str:
        return f"projects/{self.project_id}/locations/{self.location}/clusters/{self.cluster_name}"

    @property
    def nodes_per_pool(self) -> int:
        return self.tpu.num_hosts if self.tpu.multi_host else self.tpu.total_hosts

    def body(self, index: int = 0, capacity: Capacity | None = None, zone: str | None = None) -> dict[str, Any]:
        """The NodePool message for pool `index` with `capacity` in `zone` (default: the first choice)."""
        cap = capacity or self.capacities[0]
        config: dict[str, Any] = {"machineType": self.tpu.machine_type}
        if self.node_labels:
            config["labels"] = dict(self.node_labels)
        if self.node_taints:
            config["taints"] = [dict(t) for t in self.node_taints]
        if self.service_account:
            config["serviceAccount"] = self.service_account
        if self.resource_labels:
            config["resourceLabels"] = dict(self.resource_labels)
        if cap.kind == "reservation":
            config["reservationAffinity"] = {
                "consumeReservationType": "SPECIFIC_RESERVATION",
                "key": RESERVATION_KEY,
                "values": [cap.reservation],
            }
        else:
            # Explicit, so a pool never silently eats (or waits for) someone else's reservation.
            config["reservationAffinity"] = {"consumeReservationType": "NO_RESERVATION"}
        if cap.kind == "spot":
            config["spot"] = True
        if cap.autoscaled:
            config["flexStart"] = True
        max_run = self.max_run_duration(cap)
        if max_run is not None:
            config["maxRunDuration"] = f"{max_run}s"

        nodes = self.nodes_per_pool
        pool: dict[str, Any] = {
            "name": self.names[index],
            "config": config,
            "initialNodeCount": 0 if cap.autoscaled else nodes,
            "locations": [zone or self.node_zone],
        }
        if self.tpu.multi_host:
            if self.tpu.generation.multi_host_uses_workload_policy:
                pool["placementPolicy"] = {"policyName": self.workload_policy}
            else:
                pool["placementPolicy"] = {"type": "COMPACT", "tpuTopology": self.tpu.topology}
        if cap.kind == "flex-start":
            pool["autoscaling"] = {"enabled": True, "minNodeCount": 0, "maxNodeCount": nodes}
        elif cap.kind == "queued":
            pool["autoscaling"] = {
                "enabled": True,
                "totalMinNodeCount": 0,
                "totalMaxNodeCount": nodes,
                "locationPolicy": "ANY",
            }
            pool["queuedProvisioning"] = {"enabled": True}
            pool["management"] = {"autoRepair": False}
        return pool

    def bodies(self, capacity: Capacity | None = None) -> list[dict[str, Any]]:
        return [self.body(i, capacity) for i in range(len(self.names))]

    def describe(self) -> dict[str, Any]:
        """A small JSON summary for XCom and logs."""
        return {
            "project_id": self.project_id,
            "location": self.location,
            "cluster_name": self.cluster_name,
            "node_zone": self.node_zone,
            "node_pool_names": list(self.names),
            "machine_type": self.tpu.machine_type,
            "topology": self.tpu.topology,
            "accelerator": self.tpu.generation.gke_accelerator,
            "num_slices": self.tpu.num_slices,
            "nodes_per_pool": self.nodes_per_pool,
            "node_selector": self.tpu.node_selector,
            "capacity_order": [str(c) for c in self.capacities],
            **({"zones": list(self.zones), "zone_failover": self.zone_failover} if len(self.zones) > 1 else {}),
            "max_run_duration_s": self.max_run_duration_s,
            **({"workload_policy": self.workload_policy} if self.workload_policy else {}),
            **({"made_workload_policy": self.made_workload_policy.describe()} if self.made_workload_policy else {}),
        }


_FROM_FLAGS: Any = object()  # plan_node_pools' tpu_slice when the slice comes from the separate fields


def gke_slice(value: Any, field: str = SLICE_FIELD) -> TpuSlice:
    """The TpuSlice a (rendered) ``tpu_slice`` argument names, in a shape GKE takes."""
    return resolve_slice(value, field, gke=True)


def plan_node_pools(
    *,
    project_id: str,
    location: str,
    cluster_name: str,
    tpu_slice: Any = _FROM_FLAGS,
    accelerator: str | None = None,
    topology: str | None = None,
    machine_type: str | None = None,
    num_slices: int | str = 1,
    capacity: object = "on-demand",
    fallback_capacity: object = (),
    node_zone: object = None,
    zone_failover: str = "zone-first",
    node_pool_name: str | None = None,
    node_labels: Mapping[str, str] | None = None,
    node_taints: Sequence[object] | str | None = None,
    service_account: str | None = None,
    workload_policy: str | None = None,
    identity: TaskIdentity | None = None,
    expires_at: int | None = None,
    max_run_duration_s: int | None = None,
) -> NodePoolPlan:
    """Validate every input (raising UserInputError / SliceSpecError naming the field) and plan the pools.

    The slice: ``tpu_slice`` (the operators' argument, tpuflow.tpu.slice_argument), else ``accelerator``,
    ``topology``, ``machine_type`` and ``num_slices`` (the ``tpuflow render nodepool`` flags)."""
    check_project(project_id)
    location, zones = check_zones(location, node_zone)
    zone = zones[0]
    zone_failover = check_zone_failover(zone_failover)
    check_cluster_name(cluster_name)
    if tpu_slice is _FROM_FLAGS:
        tpu_slice = TpuSlice.from_spec(accelerator, topology, machine_type, num_slices)  # type: ignore[arg-type]
        tpu = tpu_slice.require(gke=True)  # a bad flag is named as such, not as tpu_slice.<key>
    else:
        tpu = gke_slice(tpu_slice)
    capacities = parse_capacity_order(capacity, fallback_capacity)
    labels = gce_ownership_labels(identity, expires_at) if identity is not None else {}
    made_policy = None
    if tpu.multi_host and tpu.generation.multi_host_uses_workload_policy:
        if not workload_policy:
            # Placed by a workload policy, not a topology: the create task makes one (tpuflow.gke.workload_policy).
            made_policy = plan_workload_policy(
                project_id=project_id,
                zone=zone,
                generation=tpu.generation.name,
                topology=tpu.topology,
                identity=identity,
                resource_labels=labels,
            )
            workload_policy = made_policy.name
        elif not _GCE_NAME_RE.match(workload_policy):
            raise UserInputError("workload_policy", workload_policy, "give the workload policy's name (not its URL)")
    elif workload_policy:
        raise UserInputError(
            "workload_policy", workload_policy, "only multi-host tpu7x pools take a workload policy; drop it"
        )
    names = node_pool_names(tpu, identity=identity, explicit=node_pool_name or None)
    return NodePoolPlan(
        project_id=project_id,
        location=location,
        cluster_name=cluster_name,
        node_zone=zone,
        tpu=tpu,
        capacities=capacities,
        names=names,
        node_labels=check_node_labels(node_labels),
        node_taints=tuple(check_node_taints(node_taints)),
        service_account=check_service_account(service_account),
        workload_policy=workload_policy or None,
        resource_labels=labels,
        made_workload_policy=made_policy,
        max_run_duration_s=check_whole_seconds("max_run_duration", max_run_duration_s),
        zones=zones,
        zone_failover=zone_failover,
    )


# --- recognising an existing pool ------------------------------------------------------------------------
def _get(d: Mapping[str, Any], path: str) -> Any:
    cur: Any = d
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


# (path, default GKE omits from its JSON when unset)
_EXACT_FIELDS: tuple[tuple[str, Any], ...] = (
    ("config.machineType", None),
    ("initialNodeCount", 0),
    ("locations", None),
    ("placementPolicy.type", None),
    ("placementPolicy.tpuTopology", None),
    ("placementPolicy.policyName", None),
    ("config.spot", False),
    ("config.flexStart", False),
    ("config.reservationAffinity.consumeReservationType", None),
    ("config.reservationAffinity.values", None),
    ("queuedProvisioning.enabled", False),
    ("autoscaling.enabled", False),
    ("autoscaling.maxNodeCount", 0),
    ("autoscaling.totalMaxNodeCount", 0),
)


def _norm(value: Any, default: Any) -> Any:
    if value in (None, "", [], {}) or value == default:
        return default
    if value == "TYPE_UNSPECIFIED" or value == "UNSPECIFIED":
        return default
    return value


def spec_differences(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """What differs between the pool we would create and one that exists (both REST JSON NodePools).

    Labels and taints only need to be present (GKE adds its own, e.g. the google.com/tpu taint);
    ownership labels and anything GKE fills in are ignored.
    """
    diffs = []
    for path, default in _EXACT_FIELDS:
        want, have = _norm(_get(desired, path), default), _norm(_get(actual, path), default)
        if path == "config.reservationAffinity.consumeReservationType":
            # GKE reports an unset affinity as NO_RESERVATION's opposite (ANY); we always set it explicitly.
            want = want or "ANY_RESERVATION"
            have = have or "ANY_RESERVATION"
        if want != have:
            diffs.append(f"{path}: want {want!r}, found {have!r}")
    want_sa = _get(desired, "config.serviceAccount")
    if want_sa and want_sa != _get(actual, "config.serviceAccount"):
        diffs.append(f"config.serviceAccount: want {want_sa!r}, found {_get(actual, 'config.serviceAccount')!r}")
    have_labels = _get(actual, "config.labels") or {}
    for key, val in (_get(desired, "config.labels") or {}).items():
        if have_labels.get(key) != val:
            diffs.append(f"config.labels[{key!r}]: want {val!r}, found {have_labels.get(key)!r}")
    have_taints = [
        (t.get("key"), t.get("value", "") or "", t.get("effect")) for t in (_get(actual, "config.taints") or [])
    ]
    for t in _get(desired, "config.taints") or []:
        if (t["key"], t.get("value", ""), t["effect"]) not in have_taints:
            diffs.append(f"config.taints: missing {t['key']}={t.get('value', '')}:{t['effect']}")
    return diffs


def match_choice(plan: NodePoolPlan, index: int, actual: Mapping[str, Any]) -> tuple[int | None, list[str]]:
    """The index of the (zone, capacity) choice an existing pool was created with, or (None, differences to the
    closest choice)."""
    best: list[str] | None = None
    for number, (zone, cap) in enumerate(plan.choices):
        diffs = spec_differences(plan.body(index, cap, zone), actual)
        if not diffs:
            return number, []
        if best is None or len(diffs) < len(best):
            best = diffs
    return None, best or []


def match_capacity(plan: NodePoolPlan, index: int, actual: Mapping[str, Any]) -> tuple[Capacity | None, list[str]]:
    """The capacity choice an existing pool was created with, or (None, differences to the closest choice)."""
    number, diffs = match_choice(plan, index, actual)
    return (None, diffs) if number is None else (plan.choices[number][1], [])
