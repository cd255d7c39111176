"""A stand-in for the Compute Engine v1 REST API's regional resource policies (workload policies).

Served by the GKE stand-in's HTTP server (``tpuflow_rehearsal.standins.gke_api``) under ``/compute/v1``,
so the real ``google.cloud.compute_v1.ResourcePoliciesClient`` (REST transport, anonymous
credentials, ``api_endpoint`` = the GKE stand-in's URL) talks to it unchanged:

- ``POST/GET .../regions/R/resourcePolicies``, ``GET/DELETE .../resourcePolicies/NAME``
- ``GET .../regions/R/operations/OP`` and ``POST .../operations/OP/wait``

under ``/compute/v1/projects/P``. Insert and delete return a RUNNING regional Operation that is DONE
after ``operation_seconds``; the policy exists (status READY) once its insert is DONE and is gone once
its delete is DONE. Rules are Compute's documented ones for workload policies: a name is a GCE name
(``[a-z]([-a-z0-9]{0,61}[a-z0-9])?``), the type is HIGH_THROUGHPUT or HIGH_AVAILABILITY, an
acceleratorTopology (``AxBxC``) only with HIGH_THROUGHPUT; a duplicate name is 409 alreadyExists, a
missing one 404 notFound, and a policy still used by a node pool (``in_use``) cannot be deleted.
Errors use Compute's JSON shape ``{"error": {"code", "message", "errors": [{"reason", ...}]}}``.
Only workload policies are served; other policy kinds are refused with 400.
"""

from __future__ import annotations

import copy
import itertools
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

COMPUTE_PREFIX = "/compute/v1/"
_API = "https://www.googleapis.com/compute/v1"
_NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_TOPOLOGY_RE = re.compile(r"^[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*$")
WORKLOAD_POLICY_TYPES = ("HIGH_THROUGHPUT", "HIGH_AVAILABILITY")
_OTHER_POLICY_KINDS = (
    "snapshotSchedulePolicy",
    "groupPlacementPolicy",
    "instanceSchedulePolicy",
    "diskConsistencyGroupPolicy",
)
_ROUTES = [
    (re.compile(r"^/compute/v1/projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/resourcePolicies$"), "policies"),
    (re.compile(r"^/compute/v1/projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/resourcePolicies/(?P<n>[^/]+)$"), "policy"),
    (re.compile(r"^/compute/v1/projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/operations/(?P<n>[^/]+)$"), "operation"),
    (re.compile(r"^/compute/v1/projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/operations/(?P<n>[^/]+)/wait$"), "wait"),
]
_WAIT_MAX_S = 120.0  # Compute's operations.wait returns after at most about two minutes


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class ComputeError(Exception):
    """An HTTP error answer in Compute's JSON error shape."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            }
        }


def _invalid_field(field_name: str, value: Any, why: str) -> ComputeError:
    return ComputeError(400, "invalid", f"Invalid value for field '{field_name}': '{value}'. {why}")


def _policy_url(project: str, region: str, name: str) -> str:
    return f"{_API}/projects/{project}/regions/{region}/resourcePolicies/{name}"


def validate_policy(body: Any) -> dict[str, Any]:
    """Check an insert body like Compute does for workload policies; return the policy as stored."""
    if not isinstance(body, Mapping):
        raise ComputeError(400, "parseError", "Invalid JSON payload: the request body must be a ResourcePolicy.")
    name = body.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise _invalid_field(
            "resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'"
        )
    others = [k for k in _OTHER_POLICY_KINDS if body.get(k)]
    if others:
        raise ComputeError(400, "invalid", f"The stand-in serves workload policies only, not {', '.join(others)}.")
    policy = body.get("workloadPolicy")
    if not isinstance(policy, Mapping):
        raise ComputeError(400, "invalid", "Invalid resource policy: exactly one policy (workloadPolicy) must be set.")
    kind = policy.get("type")
    if kind not in WORKLOAD_POLICY_TYPES:
        raise _invalid_field(
            "resource.workloadPolicy.type", kind, f"Must be one of {', '.join(WORKLOAD_POLICY_TYPES)}."
        )
    topology = policy.get("acceleratorTopology")
    if topology is not None:
        if kind != "HIGH_THROUGHPUT":
            raise _invalid_field(
                "resource.workloadPolicy.acceleratorTopology", topology, "Only a HIGH_THROUGHPUT policy takes one."
            )
        if not isinstance(topology, str) or not _TOPOLOGY_RE.match(topology):
            raise _invalid_field(
                "resource.workloadPolicy.acceleratorTopology", topology, "Write the topology as AxBxC, e.g. 2x2x2."
            )
    stored: dict[str, Any] = {"name": name, "workloadPolicy": dict(policy)}
    if body.get("description"):
        stored["description"] = str(body["description"])
    return stored


@dataclass
class _Operation:
    id: str
    kind: str  # insert | delete
    project: str
    region: str
    target: str
    done_at: float
    apply: Callable[[], None]
    insert_time: str = field(default_factory=_now_iso)
    end_time: str | None = None
    number: int = 0

    def to_json(self) -> dict[str, Any]:
        region_url = f"{_API}/projects/{self.project}/regions/{self.region}"
        out: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(self.number),
            "name": self.id,
            "operationType": self.kind,
            "targetLink": _policy_url(self.project, self.region, self.target),
            "status": "DONE" if self.end_time else "RUNNING",
            "progress": 100 if self.end_time else 0,
            "user": "standin@tpuflow.invalid",
            "insertTime": self.insert_time,
            "startTime": self.insert_time,
            "selfLink": f"{region_url}/operations/{self.id}",
            "region": region_url,
        }
        if self.end_time:
            out["endTime"] = self.end_time
        return out


class ComputeResourcePolicies:
    """Regional resource policies and their operations; thread-safe.

    ``in_use(project, region, name)`` names what still uses a policy (the GKE stand-in's node pools),
    which Compute refuses to delete it under.
    """

    def __init__(
        self,
        *,
        operation_seconds: float = 0.5,
        in_use: Callable[[str, str, str], list[str]] | None = None,
    ) -> None:
        self.operation_seconds = float(operation_seconds)
        self.in_use = in_use or (lambda project, region, name: [])
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._policies: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._operations: dict[tuple[str, str, str], _Operation] = {}

    # --- state --------------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.monotonic()
        for op in self._operations.values():
            if op.end_time is None and now >= op.done_at:
                op.apply()
                op.end_time = _now_iso()

    def reset(self) -> None:
        with self._lock:
            self._policies.clear()
            self._operations.clear()

    def policies(self) -> list[dict[str, Any]]:
        """Every policy, as Compute shows it (for tests and the stand-in's state)."""
        with self._lock:
            self._tick()
            return [self._view(key) for key in self._policies]

    def workload_topology(self, project: str, region: str, name: str) -> str | None:
        """The acceleratorTopology of a READY HIGH_THROUGHPUT policy; None when there is no such policy."""
        with self._lock:
            self._tick()
            policy = self._policies.get((project, region, name))
            if policy is None or policy["workloadPolicy"].get("type") != "HIGH_THROUGHPUT":
                return None
            topology: str | None = policy["workloadPolicy"].get("acceleratorTopology")  # validated on insert
            return topology

    def _view(self, key: tuple[str, str, str]) -> dict[str, Any]:
        project, region, name = key
        out = copy.deepcopy(self._policies[key])
        out.update(
            {
                "kind": "compute#resourcePolicy",
                "region": f"{_API}/projects/{project}/regions/{region}",
                "selfLink": _policy_url(project, region, name),
                "status": "READY",
            }
        )
        return out

    def _new_operation(self, kind: str, key: tuple[str, str, str], apply: Callable[[], None]) -> dict[str, Any]:
        number = next(self._ids)
        op_id = f"operation-{int(time.time() * 1000)}-{number:08x}"
        project, region, name = key
        op = _Operation(op_id, kind, project, region, name, time.monotonic() + self.operation_seconds, apply)
        op.number = number
        self._operations[(project, region, op_id)] = op
        self._tick()
        return op.to_json()

    def _not_found(self, project: str, region: str, name: str) -> ComputeError:
        return ComputeError(
            404, "notFound", f"The resource 'projects/{project}/regions/{region}/resourcePolicies/{name}' was not found"
        )

    # --- API ------------------------------------------------------------------------------------------
    def insert(self, project: str, region: str, body: Any) -> dict[str, Any]:
        policy = validate_policy(body)
        key = (project, region, policy["name"])
        with self._lock:
            self._tick()
            pending = any(
                op.end_time is None and op.kind == "insert" and (op.project, op.region, op.target) == key
                for op in self._operations.values()
            )
            if key in self._policies or pending:
                raise ComputeError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{project}/regions/{region}/resourcePolicies/{policy['name']}' already exists",
                )
            policy["creationTimestamp"] = _now_iso()
            policy["id"] = str(10**15 + next(self._ids))

            def create() -> None:
                self._policies[key] = policy

            return self._new_operation("insert", key, create)

    def get(self, project: str, region: str, name: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            if (project, region, name) not in self._policies:
                raise self._not_found(project, region, name)
            return self._view((project, region, name))

    def list(self, project: str, region: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            items = [self._view(k) for k in self._policies if k[:2] == (project, region)]
            return {"kind": "compute#resourcePolicyList", "id": f"projects/{project}/regions/{region}", "items": items}

    def delete(self, project: str, region: str, name: str) -> dict[str, Any]:
        key = (project, region, name)
        users = self.in_use(project, region, name)  # outside our lock: the GKE stand-in's lock comes first
        with self._lock:
            self._tick()
            if key not in self._policies:
                raise self._not_found(project, region, name)
            if users:
                raise ComputeError(
                    400,
                    "resourceInUseByAnotherResource",
                    f"The resource_policy resource 'projects/{project}/regions/{region}/resourcePolicies/{name}' is "
                    f"already being used by '{users[0]}'",
                )

            def remove() -> None:
                self._policies.pop(key, None)

            return self._new_operation("delete", key, remove)

    def get_operation(self, project: str, region: str, op_id: str) -> dict[str, Any]:
        with self._lock:
            self._tick()
            op = self._operations.get((project, region, op_id))
            if op is None:
                raise ComputeError(
                    404,
                    "notFound",
                    f"The resource 'projects/{project}/regions/{region}/operations/{op_id}' was not found",
                )
            return op.to_json()

    def wait_operation(self, project: str, region: str, op_id: str) -> dict[str, Any]:
        """Compute's operations.wait: return once DONE, or after at most about two minutes."""
        give_up = time.monotonic() + _WAIT_MAX_S
        while True:
            current = self.get_operation(project, region, op_id)
            if current["status"] == "DONE" or time.monotonic() >= give_up:
                return current
            time.sleep(0.02)

    # --- HTTP -----------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """Answer one request under /compute/v1: (HTTP status, JSON body)."""
        try:
            return 200, self._route(method, path, body)
        except ComputeError as err:
            return err.code, err.body()

    def _route(self, method: str, path: str, body: Any) -> Any:
        for pattern, what in _ROUTES:
            m = pattern.match(path)
            if not m:
                continue
            p, r, n = m.group("p"), m.group("r"), m.groupdict().get("n")
            if what == "policies" and method == "POST":
                return self.insert(p, r, body)
            if what == "policies" and method == "GET":
                return self.list(p, r)
            if what == "policy" and method == "GET":
                return self.get(p, r, n or "")
            if what == "policy" and method == "DELETE":
                return self.delete(p, r, n or "")
            if what == "operation" and method == "GET":
                return self.get_operation(p, r, n or "")
            if what == "wait" and method == "POST":
                return self.wait_operation(p, r, n or "")
            raise ComputeError(405, "methodNotAllowed", f"{method} is not supported on {path}.")
        raise ComputeError(404, "notFound", f"The stand-in does not serve {path}.")
