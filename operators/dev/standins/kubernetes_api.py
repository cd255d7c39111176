"""A loopback Kubernetes API server for the paths tpuflow's KubeRay operators use.

The real `kubernetes` / `kubernetes_asyncio` clients (and so Airflow's KubernetesHook and
AsyncKubernetesHook) talk to it over HTTP through an ordinary kubeconfig. It serves:

- discovery: /version, /api, /api/v1, /apis, /apis/ray.io/v1, /healthz
- ray.io/v1 rayclusters, rayservices, rayjobs: GET (one / list, labelSelector, fieldSelector), POST
  (dryRun=All supported), PUT, PATCH (merge-patch, JSON patch), DELETE; `/status` subresource
- core/v1 pods (+ `/log` with tailLines), services, events (fieldSelector involvedObject.name=...),
  namespaces (any name exists)

Objects get uid, creationTimestamp, resourceVersion and generation (bumped on spec changes); a stale
resourceVersion on update is 409 Conflict, a duplicate create 409 AlreadyExists, a missing object 404
NotFound, all as Kubernetes Status objects. Status is a subresource (ignored on create/update of the
main resource). DELETE honours finalizers (deletionTimestamp first) and garbage-collects objects whose
ownerReferences point at a removed owner. Admission hooks (e.g. the GKE TPU webhook in
kuberay_controller) can deny a request with the apiserver's "admission webhook ... denied" message.
No watch, no TLS: this is a test and demo stand-in bound to 127.0.0.1.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from tpuflow.dev.standins.loopback_http import LoopbackHandler, LoopbackServer

# --- resource types -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    has_status: bool = True
    has_generation: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RAY_TYPES = {
    p: ResourceType("ray.io", "v1", p, k, has_generation=True)
    for p, k in (("rayclusters", "RayCluster"), ("rayservices", "RayService"), ("rayjobs", "RayJob"))
}
CORE_TYPES = {
    "pods": ResourceType("", "v1", "pods", "Pod"),
    "services": ResourceType("", "v1", "services", "Service"),
    "events": ResourceType("", "v1", "events", "Event", has_status=False),
    "namespaces": ResourceType("", "v1", "namespaces", "Namespace", namespaced=False),
}
RAYCLUSTERS, RAYSERVICES = RAY_TYPES["rayclusters"], RAY_TYPES["rayservices"]
PODS, SERVICES, EVENTS = CORE_TYPES["pods"], CORE_TYPES["services"], CORE_TYPES["events"]


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- errors ---------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error the API answers with a Kubernetes Status object."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, dict(details or {})

    def body(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{rtype.plural}{"." + rtype.group if rtype.group else ""} "{name}" not found',
        {"name": name, "group": rtype.group, "kind": rtype.plural},
    )


def admission_denied(webhook: str, message: str, code: int = 400) -> ApiError:
    return ApiError(
        code,
        "BadRequest" if code == 400 else "Forbidden",
        f'admission webhook "{webhook}" denied the request: {message}',
    )


# operation ("CREATE"/"UPDATE"), resource type, new object, old object (None on CREATE)
AdmissionHook = Callable[[str, ResourceType, dict[str, Any], dict[str, Any] | None], None]


# --- selectors and patches ---------------------------------------------------------------------------

_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def matches_label_selector(labels: Mapping[str, str], selector: str | None) -> bool:
    for term in _split_terms(selector or ""):
        m = _SET_TERM.match(term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            inside = labels.get(m.group(1)) in values
            if (m.group(2) == "in") != inside:
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _dotted(obj: Mapping[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def matches_field_selector(obj: Mapping[str, Any], selector: str | None) -> bool:
    for term in _split_terms(selector or ""):
        negate = "!=" in term
        key, value = (s.strip() for s in term.replace("==", "=").replace("!=", "=").split("=", 1))
        actual = _dotted(obj, key)
        actual_text = "" if actual is None else str(actual)
        if (actual_text == value) == negate:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")] if path else []


def json_patch(target: Any, ops: Iterable[Mapping[str, Any]]) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, test."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = _pointer(str(op.get("path", "")))
        if not parts:
            raise ApiError(422, "Invalid", "JSON patch on the whole document is not supported")
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last, kind = parts[-1], op.get("op")
        try:
            if kind == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
                if current != op.get("value"):
                    raise ApiError(422, "Invalid", f"JSON patch test failed at {op.get('path')}")
            elif kind in ("add", "replace"):
                if isinstance(parent, list):
                    index = len(parent) if last == "-" else int(last)
                    if kind == "add":
                        parent.insert(index, op.get("value"))
                    else:
                        parent[index] = op.get("value")
                else:
                    parent[last] = op.get("value")
            elif kind == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    parent.pop(last)
            else:
                raise ApiError(422, "Invalid", f"unsupported JSON patch op {kind!r}")
        except (KeyError, IndexError, ValueError) as err:
            raise ApiError(422, "Invalid", f"JSON patch path {op.get('path')} does not exist") from err
    return doc


def apply_crd_defaults(value: Any) -> None:
    """A little of the apiserver's structural-schema defaulting (KubeRay CRDs): container ports get
    protocol TCP. Enough that clients cannot assume the stored spec equals what they sent."""
    if isinstance(value, dict):
        if "containerPort" in value:
            value.setdefault("protocol", "TCP")
        for item in value.values():
            apply_crd_defaults(item)
    elif isinstance(value, list):
        for item in value:
            apply_crd_defaults(item)


# --- the object store ------------------------------------------------------------------------------


class ObjectStore:
    """Thread-safe objects by (type, namespace, name) with the apiserver's bookkeeping."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.changed = threading.Condition(self._lock)
        self._objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._rv = 0
        self._logs: dict[tuple[str, str], list[str]] = {}
        self.admission: list[AdmissionHook] = []

    # --- helpers ---
    @staticmethod
    def _key(rtype: ResourceType, namespace: str | None, name: str) -> tuple[str, str, str, str]:
        return (rtype.group, rtype.plural, (namespace or "") if rtype.namespaced else "", name)

    def _bump(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self.changed.notify_all()

    @property
    def resource_version(self) -> int:
        return self._rv

    def wait_for_change(self, since: int, timeout: float) -> int:
        with self._lock:
            self.changed.wait_for(lambda: self._rv != since, timeout=timeout)
            return self._rv

    def _admit(self, operation: str, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        for hook in list(self.admission):
            hook(operation, rtype, obj, old)

    # --- API verbs ---
    def create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: Mapping[str, Any],
        *,
        dry_run: bool = False,
        admit: bool = True,
    ) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{secrets.token_hex(3)[:5]}"
            else:
                raise ApiError(
                    422,
                    "Invalid",
                    f"{rtype.kind}.{rtype.group or 'core'} is invalid: metadata.name: "
                    "Required value: name or generateName is required",
                )
        if rtype.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        obj.setdefault("apiVersion", rtype.api_version)
        obj.setdefault("kind", rtype.kind)
        if rtype.has_status and rtype.group:
            obj.pop("status", None)  # status is a subresource for custom resources
        if rtype.group:
            apply_crd_defaults(obj.get("spec"))
        with self._lock:
            key = self._key(rtype, meta.get("namespace"), meta["name"])
            if key in self._objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{rtype.plural}{"." + rtype.group if rtype.group else ""} "{meta["name"]}" already exists',
                    {"name": meta["name"], "group": rtype.group, "kind": rtype.plural},
                )
            meta.setdefault("labels", {})
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            if rtype.has_generation:
                meta["generation"] = 1
            if admit:
                self._admit("CREATE", rtype, obj, None)
            if dry_run:
                return copy.deepcopy(obj)
            self._objects[key] = obj
            self._bump(obj)
            return copy.deepcopy(obj)

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self._objects.get(self._key(rtype, namespace, name))
            if obj is None:
                raise not_found(rtype, name)
            return copy.deepcopy(obj)

    def find(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self.get(rtype, namespace, name)
        except ApiError:
            return None

    def list(
        self,
        rtype: ResourceType,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (g, p, ns, _), obj in sorted(self._objects.items())
                if g == rtype.group
                and p == rtype.plural
                and (namespace is None or ns == namespace)
                and matches_label_selector((obj.get("metadata") or {}).get("labels") or {}, label_selector)
                and matches_field_selector(obj, field_selector)
            ]
        return items

    def replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str | None = None,
        admit: bool = True,
    ) -> dict[str, Any]:
        with self._lock:
            key = self._key(rtype, namespace, name)
            old = self._objects.get(key)
            if old is None:
                raise not_found(rtype, name)
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if sent_rv and str(sent_rv) != old["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on {rtype.plural}"
                    f'{"." + rtype.group if rtype.group else ""} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and "
                    "try again",
                    {"name": name, "group": rtype.group, "kind": rtype.plural},
                )
            new = copy.deepcopy(dict(body))
            if subresource == "status":
                merged = copy.deepcopy(old)
                merged["status"] = new.get("status") or {}
                new = merged
            else:
                if (new.get("metadata") or {}).get("name", name) != name:
                    raise ApiError(400, "BadRequest", "metadata.name cannot be changed")
                meta = dict(new.get("metadata") or {})
                for kept in ("uid", "creationTimestamp", "namespace", "generation", "deletionTimestamp"):
                    if kept in old["metadata"]:
                        meta[kept] = old["metadata"][kept]
                    else:
                        meta.pop(kept, None)
                meta.setdefault("labels", {})
                new["metadata"] = meta
                new.setdefault("apiVersion", old.get("apiVersion"))
                new.setdefault("kind", old.get("kind"))
                if rtype.has_status and rtype.group:
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
                if rtype.group:
                    apply_crd_defaults(new.get("spec"))
                if rtype.has_generation and new.get("spec") != old.get("spec"):
                    meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
                if admit:
                    self._admit("UPDATE", rtype, new, old)
            self._objects[key] = new
            self._bump(new)
            self._collect_if_released(rtype, key)
            return copy.deepcopy(new)

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            current = self.get(rtype, namespace, name)
            if "json-patch" in content_type:
                if not isinstance(patch, list):
                    raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
                patched = json_patch(current, patch)
            else:  # merge-patch (and strategic-merge, treated as merge for custom resources)
                if not isinstance(patch, Mapping):
                    raise ApiError(400, "BadRequest", "a merge patch is a JSON object")
                patched = merge_patch(current, patch)
            # Only a resourceVersion the patch itself carries is a precondition.
            sent = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, Mapping) else None
            patched.setdefault("metadata", {})["resourceVersion"] = sent
            return self.replace(rtype, namespace, name, patched, subresource=subresource)

    def delete(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        with self._lock:
            key = self._key(rtype, namespace, name)
            obj = self._objects.get(key)
            if obj is None:
                raise not_found(rtype, name)
            if obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = now_iso()
                    self._bump(obj)
                return copy.deepcopy(obj)
            self._remove(key)
            return copy.deepcopy(obj)

    # --- controller-side helpers (no admission, no resourceVersion check) ---
    def mutate(
        self, rtype: ResourceType, namespace: str | None, name: str, fn: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any] | None:
        """Apply fn to the stored object in place (controllers writing status); None if it is gone."""
        with self._lock:
            key = self._key(rtype, namespace, name)
            obj = self._objects.get(key)
            if obj is None:
                return None
            before = json.dumps(obj, sort_keys=True)
            fn(obj)
            if json.dumps(obj, sort_keys=True) != before:
                self._bump(obj)
                self._collect_if_released(rtype, key)
            return copy.deepcopy(obj) if key in self._objects else None

    def upsert(self, rtype: ResourceType, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create or overwrite (controllers' own pods, services)."""
        name = body["metadata"]["name"]
        with self._lock:
            if self._key(rtype, namespace, name) in self._objects:
                existing = self.get(rtype, namespace, name)
                new = copy.deepcopy(dict(body))
                new["metadata"] = {**existing["metadata"], **new["metadata"]}
                new["metadata"].pop("resourceVersion", None)
                return self.replace(rtype, namespace, name, new, admit=False) if new != existing else existing
            return self.create(rtype, namespace, body, admit=False)

    def remove_finalizer(self, rtype: ResourceType, namespace: str | None, name: str, finalizer: str) -> None:
        def drop(obj: dict[str, Any]) -> None:
            obj["metadata"]["finalizers"] = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]

        self.mutate(rtype, namespace, name, drop)

    def _collect_if_released(self, rtype: ResourceType, key: tuple[str, str, str, str]) -> None:
        obj = self._objects.get(key)
        if obj and obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            self._remove(key)

    def _remove(self, key: tuple[str, str, str, str]) -> None:
        obj = self._objects.pop(key)
        self._rv += 1
        self.changed.notify_all()
        uid = obj["metadata"].get("uid")
        if key[1] == "pods":
            self._logs.pop((key[2], key[3]), None)
        # Garbage collection: dependents whose owner is gone are deleted too (foreground-free, like "Background").
        for dep_key, dep in list(self._objects.items()):
            owners = (dep.get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("uid") == uid for o in owners) and dep_key in self._objects:
                if dep["metadata"].get("finalizers"):
                    if not dep["metadata"].get("deletionTimestamp"):
                        dep["metadata"]["deletionTimestamp"] = now_iso()
                        self._bump(dep)
                else:
                    self._remove(dep_key)

    # --- pod logs and events ---
    def append_log(self, namespace: str, pod: str, lines: Iterable[str]) -> None:
        with self._lock:
            self._logs.setdefault((namespace, pod), []).extend(lines)

    def set_log(self, namespace: str, pod: str, lines: Iterable[str]) -> None:
        with self._lock:
            self._logs[(namespace, pod)] = list(lines)

    def read_log(self, namespace: str, pod: str, tail_lines: int | None = None) -> list[str]:
        with self._lock:
            lines = list(self._logs.get((namespace, pod), []))
        return lines[-tail_lines:] if tail_lines else lines

    def record_event(
        self,
        namespace: str,
        involved: Mapping[str, Any],
        event_type: str,
        reason: str,
        message: str,
        component: str = "kuberay-operator",
    ) -> None:
        """A core/v1 Event; a repeat of the same (object, reason, message) bumps count like the apiserver."""
        name = f"{involved['name']}.{abs(hash((reason, message))) % 10**10:010d}"
        with self._lock:
            key = self._key(EVENTS, namespace, name)
            existing = self._objects.get(key)
            stamp = now_iso()
            if existing:
                existing["count"] = int(existing.get("count", 1)) + 1
                existing["lastTimestamp"] = stamp
                self._bump(existing)
                return
            self.create(
                EVENTS,
                namespace,
                {
                    "metadata": {"name": name, "namespace": namespace},
                    "involvedObject": {
                        k: involved[k] for k in ("kind", "name", "namespace", "uid", "apiVersion") if involved.get(k)
                    },
                    "reason": reason,
                    "message": message,
                    "type": event_type,
                    "count": 1,
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "source": {"component": component},
                },
                admit=False,
            )


# --- HTTP ------------------------------------------------------------------------------------------

_CORE_NS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")
_CORE_ALL = re.compile(r"^/api/v1/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$")
_GROUP_NS = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
_GROUP_ALL = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/(?P<plural>[^/]+)$")


def _resource_list(group_version: str, types: Iterable[ResourceType]) -> dict[str, Any]:
    resources = []
    for t in types:
        verbs = ["get", "list", "create", "update", "patch", "delete"]
        resources.append(
            {
                "name": t.plural,
                "singularName": t.kind.lower(),
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": verbs,
            }
        )
        if t.has_status:
            resources.append(
                {
                    "name": f"{t.plural}/status",
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if t.plural == "pods":
            resources.append(
                {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]}
            )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}


def _yaml_body(raw: bytes, err: ValueError) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as yaml_err:
        raise ApiError(400, "BadRequest", f"request body is not JSON: {yaml_err}") from err


class _Handler(LoopbackHandler):
    # --- plumbing ---
    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        self.send_body(code, body, content_type)

    def _body(self) -> Any:
        return self.parse_body(_yaml_body)

    def _handle(self) -> None:
        started = time.monotonic()
        code = 500
        try:
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            body = self._body() if self.command in ("POST", "PUT", "PATCH", "DELETE") else None
            token = self.server.standin.token
            if (
                token
                and self.headers.get("Authorization") != f"Bearer {token}"
                and split.path not in ("/healthz", "/readyz", "/livez")
            ):
                raise ApiError(401, "Unauthorized", "Unauthorized")
            code, payload, ctype = self._route(split.path.rstrip("/") or "/", query, body)
            self._send(code, payload, ctype)
        except ApiError as err:
            code = err.code
            self._send(err.code, err.body())
        except Exception as err:  # a bug in the stand-in: answer like a broken apiserver would
            code = 500
            self._send(500, ApiError(500, "InternalError", f"stand-in error: {type(err).__name__}: {err}").body())
        finally:
            self.server.standin.requests.append((self.command, self.path, code, round(time.monotonic() - started, 4)))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    # --- routing ---
    def _route(self, path: str, query: dict[str, str], body: Any) -> tuple[int, Any, str]:
        store = self.server.standin.store
        method = self.command
        if path in ("/healthz", "/readyz", "/livez"):
            return 200, "ok", "text/plain"
        if method == "GET" and path == "/version":
            return (
                200,
                {
                    "major": "1",
                    "minor": "33",
                    "gitVersion": "v1.33.0-tpuflow-standin",
                    "gitCommit": "standin",
                    "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "none",
                    "compiler": "none",
                    "platform": "linux/amd64",
                },
                "application/json",
            )
        if method == "GET" and path == "/api":
            return (
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.server.server_port}"}
                    ],
                },
                "application/json",
            )
        if method == "GET" and path == "/api/v1":
            return 200, _resource_list("v1", CORE_TYPES.values()), "application/json"
        if method == "GET" and path == "/apis":
            gv = {"groupVersion": "ray.io/v1", "version": "v1"}
            return (
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [{"name": "ray.io", "versions": [gv], "preferredVersion": gv}],
                },
                "application/json",
            )
        if method == "GET" and path == "/apis/ray.io/v1":
            return 200, _resource_list("ray.io/v1", RAY_TYPES.values()), "application/json"

        m = _GROUP_NS.match(path) or _CORE_NS.match(path)
        if m:
            g = m.groupdict()
            rtype = self._rtype(g.get("group") or "", g.get("version") or "v1", g["plural"])
            return self._resource(store, rtype, g["ns"], g.get("name"), g.get("sub"), query, body)
        m = _GROUP_ALL.match(path)
        if m:
            rtype = self._rtype(m["group"], m["version"], m["plural"])
            return self._resource(store, rtype, None, None, None, query, body)
        m = _CORE_ALL.match(path)
        if m:
            rtype = self._rtype("", "v1", m["plural"])
            if rtype.plural == "namespaces":
                return self._namespace(m["name"])
            return self._resource(store, rtype, None, m["name"], None, query, body)
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {path})")

    @staticmethod
    def _rtype(group: str, version: str, plural: str) -> ResourceType:
        table = RAY_TYPES if group == "ray.io" else CORE_TYPES if group == "" else {}
        rtype = table.get(plural)
        if rtype is None or version != rtype.version:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ({group or 'core'}/{version} {plural})",
            )
        return rtype

    def _namespace(self, name: str | None) -> tuple[int, Any, str]:
        if self.command != "GET":
            raise ApiError(405, "MethodNotAllowed", "the stand-in has every namespace already")

        def ns(n: str) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}, "status": {"phase": "Active"}}

        if name:
            return 200, ns(name), "application/json"
        return (
            200,
            {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {}, "items": [ns("default")]},
            "application/json",
        )

    def _resource(
        self,
        store: ObjectStore,
        rtype: ResourceType,
        ns: str | None,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
        body: Any,
    ) -> tuple[int, Any, str]:
        method = self.command
        if query.get("watch") in ("true", "1"):
            raise ApiError(400, "BadRequest", "watch is not supported by the tpuflow Kubernetes stand-in; poll instead")
        if sub not in (None, "status", "log") or (sub == "log" and rtype.plural != "pods"):
            raise ApiError(404, "NotFound", f"no subresource {sub!r} on {rtype.plural}")
        if name is None:
            if method == "GET":
                items = store.list(rtype, ns, query.get("labelSelector"), query.get("fieldSelector"))
                return (
                    200,
                    {
                        "kind": f"{rtype.kind}List",
                        "apiVersion": rtype.api_version,
                        "metadata": {"resourceVersion": str(store.resource_version)},
                        "items": items,
                    },
                    "application/json",
                )
            if method == "POST" and ns is not None:
                if not isinstance(body, Mapping):
                    raise ApiError(400, "BadRequest", "the request body must be an object")
                obj = store.create(rtype, ns, body, dry_run=query.get("dryRun") == "All")
                return 201, obj, "application/json"
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection here")
        if sub == "log":
            return self._log(store, ns or "default", name, query)
        if method == "GET":
            return 200, store.get(rtype, ns, name), "application/json"
        if method == "PUT":
            if not isinstance(body, Mapping):
                raise ApiError(400, "BadRequest", "the request body must be an object")
            return 200, store.replace(rtype, ns, name, body, subresource=sub), "application/json"
        if method == "PATCH":
            ctype = self.headers.get("Content-Type", "application/merge-patch+json")
            return 200, store.patch(rtype, ns, name, body, ctype, subresource=sub), "application/json"
        if method == "DELETE":
            return 200, store.delete(rtype, ns, name), "application/json"
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed")

    def _log(self, store: ObjectStore, ns: str, name: str, query: dict[str, str]) -> tuple[int, Any, str]:
        pod = store.get(PODS, ns, name)
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = query.get("container") or (containers[0] if containers else "")
        if container and containers and container not in containers:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        if (pod.get("status") or {}).get("phase") == "Pending":
            raise ApiError(
                400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        tail = int(query["tailLines"]) if query.get("tailLines", "").isdigit() else None
        lines = store.read_log(ns, name, tail)
        return 200, "".join(f"{line}\n" for line in lines), "text/plain"


class KubernetesApiStandin:
    """The loopback API server. `with KubernetesApiStandin() as api: api.write_kubeconfig(path)`."""

    def __init__(
        self, *, store: ObjectStore | None = None, token: str | None = None, require_token: bool = True, port: int = 0
    ) -> None:
        self.store = store or ObjectStore()
        self.token = (token or secrets.token_hex(16)) if require_token else None
        self.requests: list[tuple[str, str, int, float]] = []
        self._http = LoopbackServer(_Handler, self, port=port, name="k8s-standin")

    def start(self) -> KubernetesApiStandin:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def __enter__(self) -> KubernetesApiStandin:
        return self.start() if not self._http.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        return self._http.url

    # --- how clients find it ---
    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [{"name": "tpuflow-standin", "cluster": {"server": self.url}}],
            "users": [{"name": "tpuflow-standin", "user": user}],
            "contexts": [
                {
                    "name": "tpuflow-standin",
                    "context": {"cluster": "tpuflow-standin", "user": "tpuflow-standin", "namespace": namespace},
                }
            ],
            "current-context": "tpuflow-standin",
        }

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        target.chmod(0o600)
        return target

    def airflow_connection_env(
        self, conn_id: str, kubeconfig_path: str | Path, namespace: str = "default"
    ) -> dict[str, str]:
        """{"AIRFLOW_CONN_<ID>": json} for a `kubernetes` connection that reaches this stand-in."""
        value = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig_path), "namespace": namespace}}
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(value)}
