"""A loopback Kubernetes API server for the paths tpuflow's KubeRay operators and kubectl use.

The real `kubernetes` / `kubernetes_asyncio` clients (and so Airflow's KubernetesHook and
AsyncKubernetesHook) and kubectl talk to it over HTTPS (a throw-away CA, see tls.py, written into the
kubeconfig with the bearer token) through an ordinary kubeconfig. It serves:

- discovery: /version, /api, /api/v1, /apis, /apis/ray.io/v1 (short names, categories, verbs),
  /healthz; OpenAPI v3 (/openapi/v3: paths, the fieldValidation parameter, the CRD schemas)
- ray.io/v1 rayclusters, rayservices, rayjobs: GET (one / list, labelSelector, fieldSelector,
  ``watch=true`` streams from a resourceVersion, with bookmarks), POST (dryRun=All supported), PUT,
  PATCH (merge-patch, JSON patch, server-side apply: create or update, per field manager), DELETE;
  `/status` subresource; tables (``Accept: ...;as=Table``) with the CRDs' additionalPrinterColumns
- core/v1 pods (+ `/log` with tailLines), services, events (fieldSelector involvedObject.name=...),
  secrets, configmaps, namespaces (any name exists), with the core printers' table columns
- field validation as the apiserver does it when CRD schemas are given (kubernetes_catalog): unknown
  fields pruned with a Warning header, refused with ``fieldValidation=Strict`` (what kubectl sends);
  schema violations 422 Invalid

Objects get uid, creationTimestamp, resourceVersion and generation (bumped on spec changes); a stale
resourceVersion on update is 409 Conflict, a duplicate create 409 AlreadyExists, a missing object 404
NotFound, all as Kubernetes Status objects. Status is a subresource (ignored on create/update of the
main resource). DELETE honours finalizers (deletionTimestamp first) and garbage-collects objects whose
ownerReferences point at a removed owner. Admission hooks (e.g. the GKE TPU webhook in
kuberay_controller) can deny a request with the apiserver's "admission webhook ... denied" message.
This is a test and demo stand-in bound to 127.0.0.1; ``kubectl port-forward`` (SPDY/WebSocket
streams) is not served: every Service reads 127.0.0.1 with the live local port, which is what a
port-forward gives on GKE.
"""

from __future__ import annotations

import builtins
import collections
import copy
import json
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

import yaml
from google.protobuf.message import DecodeError

from tpuflow_rehearsal.standins import kube_protobuf
from tpuflow_rehearsal.standins import kubernetes_catalog as catalog
from tpuflow_rehearsal.standins.loopback_http import LoopbackHandler, LoopbackServer
from tpuflow_rehearsal.standins.tls import LoopbackTls

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
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """plural.group as the apiserver names it in messages ("rayclusters.ray.io", "pods")."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RAY_TYPES = {
    p: ResourceType("ray.io", "v1", p, k, has_generation=True, categories=("all",))
    for p, k in (("rayclusters", "RayCluster"), ("rayservices", "RayService"), ("rayjobs", "RayJob"))
}
CORE_TYPES = {
    "pods": ResourceType("", "v1", "pods", "Pod", short_names=("po",), categories=("all",)),
    "services": ResourceType("", "v1", "services", "Service", short_names=("svc",), categories=("all",)),
    "events": ResourceType("", "v1", "events", "Event", has_status=False, short_names=("ev",)),
    "namespaces": ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",)),
    "secrets": ResourceType("", "v1", "secrets", "Secret", has_status=False),
    "configmaps": ResourceType("", "v1", "configmaps", "ConfigMap", has_status=False, short_names=("cm",)),
    "podtemplates": ResourceType("", "v1", "podtemplates", "PodTemplate", has_status=False),
}
# GKE's queued provisioning (tpuflow_rehearsal.standins.capacity plays the autoscaler behind it)
AUTOSCALING_TYPES = {
    "provisioningrequests": ResourceType(
        "autoscaling.x-k8s.io", "v1", "provisioningrequests", "ProvisioningRequest", short_names=("provreq", "provreqs")
    )
}
_TYPES_BY_GROUP = {"": CORE_TYPES, "ray.io": RAY_TYPES, "autoscaling.x-k8s.io": AUTOSCALING_TYPES}
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


@dataclass
class FieldValidation:
    """One API request's field validation: the directive (Strict | Warn | Ignore) and the warnings it gave."""

    directive: str = "Warn"
    warnings: list[str] = field(default_factory=list)


WATCH_HISTORY = 10000  # events kept for watches that resume from a resourceVersion


# --- selectors and patches ---------------------------------------------------------------------------

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _check_object_names(rtype: ResourceType, meta: Mapping[str, Any]) -> None:
    """What the API server's object-meta validation rejects: a name that is not an RFC 1123 subdomain,
    a namespace that is not an RFC 1123 label."""
    what = f"{rtype.kind}.{rtype.group or 'core'}"
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        raise ApiError(
            422,
            "Invalid",
            f'{what} "{name}" is invalid: metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain '
            "must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an "
            "alphanumeric character",
        )
    if rtype.namespaced and (
        not isinstance(namespace, str) or len(namespace) > 63 or not _DNS1123_LABEL.match(namespace)
    ):
        raise ApiError(
            422,
            "Invalid",
            f'{what} "{name}" is invalid: metadata.namespace: Invalid value: "{namespace}": a lowercase RFC 1123 '
            "label must consist of lower case alphanumeric characters or '-'",
        )


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


def _drop_removed(target: Any, previous: Any, applied: Any) -> Any:
    """Remove from `target` what a manager applied before (`previous`) and no longer applies (`applied`)."""
    if not isinstance(target, dict) or not isinstance(previous, Mapping):
        return target
    now = applied if isinstance(applied, Mapping) else {}
    for key, value in previous.items():
        if key not in now:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _drop_removed(target[key], value, now[key])
    return target


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


class _Target(NamedTuple):
    """What one resource request is on: the store, the resource type, the namespace (None: all), the object's name
    (None: the collection) and its subresource (status, log; None: the object itself)."""

    store: ObjectStore
    rtype: ResourceType
    ns: str | None
    name: str | None
    sub: str | None


class ObjectStore:
    """Thread-safe objects by (type, namespace, name) with the apiserver's bookkeeping."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.changed = threading.Condition(self._lock)
        self._objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._rv = 0
        self._logs: dict[tuple[str, str], list[str]] = {}
        self.admission: list[AdmissionHook] = []
        self.crds = catalog.CrdSchemas.load(None)
        # (resourceVersion, event type, key, object): what watches stream
        self._history: collections.deque[tuple[int, str, tuple[str, str, str, str], dict[str, Any]]] = (
            collections.deque(maxlen=WATCH_HISTORY)
        )
        self._applied: dict[tuple[tuple[str, str, str, str], str], dict[str, Any]] = {}

    # --- helpers ---
    @staticmethod
    def _key(rtype: ResourceType, namespace: str | None, name: str) -> tuple[str, str, str, str]:
        return (rtype.group, rtype.plural, (namespace or "") if rtype.namespaced else "", name)

    def _bump(self, obj: dict[str, Any], event: str = "MODIFIED") -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        meta = obj["metadata"]
        key = (obj.get("apiVersion", "").rpartition("/")[0], "", meta.get("namespace", ""), meta.get("name", ""))
        self._history.append((self._rv, event, key, copy.deepcopy(obj)))
        self.changed.notify_all()

    def events_since(
        self, rtype: ResourceType, namespace: str | None, since: int
    ) -> list[tuple[int, str, dict[str, Any]]] | None:
        """Watch events of `rtype` after resourceVersion `since`; None when that version is no longer kept."""
        with self._lock:
            if self._history and since < self._history[0][0] - 1 and len(self._history) == WATCH_HISTORY:
                return None
            return [
                (rv, event, copy.deepcopy(obj))
                for rv, event, _, obj in self._history
                if rv > since
                and obj.get("kind") == rtype.kind
                and obj.get("apiVersion") == rtype.api_version
                and (namespace is None or (obj.get("metadata") or {}).get("namespace") == namespace)
            ]

    def _check_fields(
        self, rtype: ResourceType, obj: dict[str, Any], validation: FieldValidation | None, operation: str
    ) -> None:
        """Field validation of an API request against the CRD schema (pruning, Strict, 422), as the apiserver does."""
        schema = self.crds.schema(rtype.plural) if rtype.group else None
        if validation is None or schema is None:
            return
        unknown = catalog.unknown_fields(schema, obj)
        if unknown and validation.directive == "Strict":
            listed = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise ApiError(
                400,
                "BadRequest",
                f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: strict decoding '
                f"error: {listed}",
            )
        if unknown:
            if validation.directive == "Warn":
                validation.warnings += [f'unknown field "{u}"' for u in unknown]
            catalog.prune(schema, obj)
        body = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
        catalog.apply_defaults(schema, body)
        obj.update(body)
        causes = catalog.schema_violations(schema, obj)
        if causes:
            name = (obj.get("metadata") or {}).get("name", "")
            text = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
            raise ApiError(
                422,
                "Invalid",
                f'{rtype.kind}.{rtype.group} "{name}" is invalid: {text if len(causes) == 1 else "[" + text + "]"}',
                {"name": name, "group": rtype.group, "kind": rtype.kind, "causes": causes},
            )

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
        validation: FieldValidation | None = None,
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
        _check_object_names(rtype, meta)
        obj.setdefault("apiVersion", rtype.api_version)
        obj.setdefault("kind", rtype.kind)
        if rtype.has_status and rtype.group:
            obj.pop("status", None)  # status is a subresource for custom resources
        self._check_fields(rtype, obj, validation, "CREATE")
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
            self._bump(obj, "ADDED")
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
        validation: FieldValidation | None = None,
        dry_run: bool = False,
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
                self._check_fields(rtype, new, validation, "UPDATE")
                if rtype.group:
                    apply_crd_defaults(new.get("spec"))
                if rtype.has_generation and new.get("spec") != old.get("spec"):
                    meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
                if admit:
                    self._admit("UPDATE", rtype, new, old)
            if dry_run:
                return copy.deepcopy(new)
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
        validation: FieldValidation | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        if "apply-patch" in content_type:
            return self.apply(
                rtype,
                namespace,
                name,
                patch,
                field_manager or "",
                validation=validation,
                dry_run=dry_run,
                subresource=subresource,
            )
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
            return self.replace(
                rtype, namespace, name, patched, subresource=subresource, validation=validation, dry_run=dry_run
            )

    def apply(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        config: Any,
        field_manager: str,
        *,
        validation: FieldValidation | None = None,
        dry_run: bool = False,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Server-side apply: create the object, or merge the manager's configuration into it; fields the
        same manager applied before and left out now are removed. Lists are replaced as a whole (atomic)."""
        if not field_manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
            )
        if not isinstance(config, Mapping):
            raise ApiError(400, "BadRequest", "an apply patch is a YAML or JSON object")
        meta = dict(config.get("metadata") or {})
        if meta.get("name") and meta["name"] != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        stamp = now_iso()
        entry = {
            "manager": field_manager,
            "operation": "Apply",
            "apiVersion": rtype.api_version,
            "time": stamp,
            "fieldsType": "FieldsV1",
            "fieldsV1": {},
        }
        with self._lock:
            key = self._key(rtype, namespace, name)
            current = self._objects.get(key)
            applied = copy.deepcopy(dict(config))
            if current is None:
                if subresource:
                    raise not_found(rtype, name)
                body = copy.deepcopy(applied)
                body.setdefault("metadata", {})["name"] = name
                body["metadata"]["managedFields"] = [entry]
                created = self.create(rtype, namespace, body, dry_run=dry_run, validation=validation)
                if not dry_run:
                    self._applied[(key, field_manager)] = applied
                return created
            previous = self._applied.get((key, field_manager), {})
            merged = _drop_removed(copy.deepcopy(current), previous, applied)
            merged = merge_patch(merged, applied)
            if subresource == "status":
                merged = {**copy.deepcopy(current), "status": merged.get("status") or {}}
            others = [
                m for m in merged.get("metadata", {}).get("managedFields") or [] if m.get("manager") != field_manager
            ]
            merged["metadata"]["managedFields"] = [*others, entry]
            merged["metadata"]["resourceVersion"] = None
            result = self.replace(
                rtype, namespace, name, merged, subresource=subresource, validation=validation, dry_run=dry_run
            )
            if not dry_run:
                self._applied[(key, field_manager)] = applied
            return result

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
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, "DELETED", key, copy.deepcopy(obj)))
        for applied in [k for k in self._applied if k[0] == key]:
            del self._applied[applied]
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

    def read_log(self, namespace: str, pod: str, tail_lines: int | None = None) -> builtins.list[str]:
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
            body = event_body(involved, event_type, reason, message, component, stamp)
            self.create(EVENTS, namespace, {**body, "metadata": {"name": name, "namespace": namespace}}, admit=False)


def event_body(
    involved: Mapping[str, Any], event_type: str, reason: str, message: str, component: str, stamp: str
) -> dict[str, Any]:
    """A core/v1 Event about ``involved``, first seen at ``stamp`` (its metadata is the writer's to add)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
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
    }


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
        entry: dict[str, Any] = {
            "name": t.plural,
            "singularName": t.kind.lower(),
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": list(catalog.VERBS),
        }
        if t.short_names:
            entry["shortNames"] = list(t.short_names)
        if t.categories:
            entry["categories"] = list(t.categories)
        resources.append(entry)
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
    if raw.startswith(kube_protobuf.MAGIC):
        try:
            return kube_protobuf.decode(raw)
        except (kube_protobuf.ProtobufBodyError, DecodeError) as proto_err:
            raise ApiError(415, "UnsupportedMediaType", f"request body is not readable protobuf: {proto_err}") from err
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as yaml_err:
        raise ApiError(400, "BadRequest", f"request body is not JSON: {yaml_err}") from err


_GROUP_VERSIONS = {
    "api/v1": ("v1", CORE_TYPES),
    "apis/ray.io/v1": ("ray.io/v1", RAY_TYPES),
    "apis/autoscaling.x-k8s.io/v1": ("autoscaling.x-k8s.io/v1", AUTOSCALING_TYPES),
}
_STREAMED = (0, None, "")  # _route's answer when the handler already streamed the response (watch)


def _true(value: str | None) -> bool:
    """A boolean query parameter as the apiserver parses it (Go's strconv.ParseBool: the Python client sends "True")."""
    return value in ("1", "t", "T", "true", "True", "TRUE")


def _partial(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata") or {}}


class _Handler(LoopbackHandler):
    # --- plumbing ---
    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = (
            body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in getattr(self, "_extra_headers", {}).items():
            self.send_header(key, value)
        for warning in getattr(self, "_warnings", []):
            quoted = warning.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
            self.send_header("Warning", f'299 - "{quoted}"')
        self.end_headers()
        self._record(code)  # before the body goes out: a client that has its answer finds the request logged
        self.wfile.write(data)

    def _record(self, code: int) -> None:
        if getattr(self, "_recorded", True):
            return
        self._recorded = True
        elapsed = round(time.monotonic() - self._started, 4)
        self.server.standin.requests.append((self.command, self.path, code, elapsed))

    def _body(self) -> Any:
        return self.parse_body(_yaml_body)

    def _handle(self) -> None:
        self._started, self._recorded = time.monotonic(), False
        code = 500
        self._warnings: list[str] = []
        self._extra_headers: dict[str, str] = {}
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
            fault = self.server.standin.take_fault(self.command, split.path)
            if fault is not None:
                if fault.code == 429:
                    self._extra_headers = {"Retry-After": str(fault.retry_after)}
                reason, message = _FAULT_STATUS[fault.code]
                raise ApiError(fault.code, reason, message)
            code, payload, ctype = self._route(split.path.rstrip("/") or "/", query, body)
            if code:
                self._send(code, payload, ctype)
            else:
                code = 200
        except ApiError as err:
            code = err.code
            self._send(err.code, err.body())
        except (BrokenPipeError, ConnectionResetError):
            code = 499  # the client went away (a watch that was stopped)
        except Exception as err:  # a bug in the stand-in: answer like a broken apiserver would
            code = 500
            self._send(500, ApiError(500, "InternalError", f"stand-in error: {type(err).__name__}: {err}").body())
        finally:
            self._record(code)  # streamed answers (watches, logs) and clients that went away

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
            groups = []
            for group in ("ray.io", "autoscaling.x-k8s.io"):
                gv = {"groupVersion": f"{group}/v1", "version": "v1"}
                groups.append({"name": group, "versions": [gv], "preferredVersion": gv})
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}, "application/json"
        if method == "GET" and path.startswith("/apis/") and path[1:] in _GROUP_VERSIONS:
            name, types = _GROUP_VERSIONS[path[1:]]
            return 200, _resource_list(name, types.values()), "application/json"
        if method == "GET" and path.startswith("/openapi/"):
            return self._openapi(store, path)

        m = _GROUP_NS.match(path) or _CORE_NS.match(path)
        if m:
            g = m.groupdict()
            rtype = self._rtype(g.get("group") or "", g.get("version") or "v1", g["plural"])
            return self._resource(_Target(store, rtype, g["ns"], g.get("name"), g.get("sub")), query, body)
        m = _GROUP_ALL.match(path)
        if m:
            rtype = self._rtype(m["group"], m["version"], m["plural"])
            return self._resource(_Target(store, rtype, None, None, None), query, body)
        m = _CORE_ALL.match(path)
        if m:
            rtype = self._rtype("", "v1", m["plural"])
            if rtype.plural == "namespaces":
                return self._namespace(m["name"], query)
            return self._resource(_Target(store, rtype, None, m["name"], None), query, body)
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {path})")

    def _openapi(self, store: ObjectStore, path: str) -> tuple[int, Any, str]:
        docs = {
            gv: catalog.openapi_v3_document(name, types.values(), store.crds)
            for gv, (name, types) in _GROUP_VERSIONS.items()
        }
        if path == "/openapi/v3":
            return (
                200,
                {
                    "paths": {
                        gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={catalog.document_hash(doc)}"}
                        for gv, doc in docs.items()
                    }
                },
                "application/json",
            )
        doc = docs.get(path.removeprefix("/openapi/v3/"))
        if doc is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return 200, doc, "application/json"

    @staticmethod
    def _rtype(group: str, version: str, plural: str) -> ResourceType:
        rtype = _TYPES_BY_GROUP.get(group, {}).get(plural)
        if rtype is None or version != rtype.version:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ({group or 'core'}/{version} {plural})",
            )
        return rtype

    def _namespace(self, name: str | None, query: dict[str, str]) -> tuple[int, Any, str]:
        if self.command != "GET":
            raise ApiError(405, "MethodNotAllowed", "the stand-in has every namespace already")

        def ns(n: str) -> dict[str, Any]:
            return {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": n, "creationTimestamp": "2026-01-01T00:00:00Z"},
                "status": {"phase": "Active"},
            }

        items = [ns(name)] if name else [ns("default")]
        if self._wants_table():
            return 200, self._table(CORE_TYPES["namespaces"], items, "1", query), "application/json"
        if name:
            return 200, items[0], "application/json"
        return 200, {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {}, "items": items}, "application/json"

    # --- tables ---
    def _wants_table(self) -> bool:
        return "as=Table" in (self.headers.get("Accept") or "")

    def _table(
        self, rtype: ResourceType, items: list[dict[str, Any]], rv: str, query: dict[str, str], columns: bool = True
    ) -> dict[str, Any]:
        store = self.server.standin.store
        include = query.get("includeObject", "Metadata")
        if rtype.group:
            printer = store.crds.printer_columns.get(rtype.plural) or []
            definitions = catalog.custom_table_columns(printer)
            rows = [catalog.custom_table_cells(printer, obj) for obj in items]
        else:
            definitions = catalog.core_table_columns(rtype.plural)
            rows = [catalog.core_table_cells(rtype.plural, obj) for obj in items]
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": rv},
            "columnDefinitions": definitions if columns else [],
            "rows": [
                {
                    "cells": cells,
                    **({} if include == "None" else {"object": obj if include == "Object" else _partial(obj)}),
                }
                for cells, obj in zip(rows, items, strict=True)
            ],
        }

    # --- resources ---
    def _resource(self, target: _Target, query: dict[str, str], body: Any) -> tuple[int, Any, str]:
        store, rtype, ns, name, sub = target
        method = self.command
        if sub not in (None, "status", "log") or (sub == "log" and rtype.plural != "pods"):
            raise ApiError(404, "NotFound", f"no subresource {sub!r} on {rtype.plural}")
        if method == "GET" and _true(query.get("watch")):
            self._watch(store, rtype, ns, name, query)
            return _STREAMED
        dry_run = query.get("dryRun") == "All"
        validation = FieldValidation(query.get("fieldValidation") or "Warn")
        try:
            return self._verb(target, query, body, dry_run, validation)
        finally:
            self._warnings = validation.warnings

    def _verb(
        self, target: _Target, query: dict[str, str], body: Any, dry_run: bool, validation: FieldValidation
    ) -> tuple[int, Any, str]:
        store, rtype, ns, name, sub = target
        method = self.command
        if name is None:
            if method == "GET":
                with store._lock:
                    rv = str(store.resource_version)
                    items = store.list(rtype, ns, query.get("labelSelector"), query.get("fieldSelector"))
                if self._wants_table():
                    return 200, self._table(rtype, items, rv, query), "application/json"
                return (
                    200,
                    {
                        "kind": f"{rtype.kind}List",
                        "apiVersion": rtype.api_version,
                        "metadata": {"resourceVersion": rv},
                        "items": items,
                    },
                    "application/json",
                )
            if method == "POST" and ns is not None:
                if not isinstance(body, Mapping):
                    raise ApiError(400, "BadRequest", "the request body must be an object")
                obj = store.create(rtype, ns, body, dry_run=dry_run, validation=validation)
                return 201, obj, "application/json"
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection here")
        if sub == "log":
            return self._log(store, ns or "default", name, query)
        if method == "GET":
            obj = store.get(rtype, ns, name)
            if self._wants_table():
                return (
                    200,
                    self._table(rtype, [obj], obj["metadata"].get("resourceVersion", ""), query),
                    "application/json",
                )
            return 200, obj, "application/json"
        if method == "PUT":
            if not isinstance(body, Mapping):
                raise ApiError(400, "BadRequest", "the request body must be an object")
            obj = store.replace(rtype, ns, name, body, subresource=sub, validation=validation, dry_run=dry_run)
            return 200, obj, "application/json"
        if method == "PATCH":
            ctype = self.headers.get("Content-Type", "application/merge-patch+json")
            existed = store.find(rtype, ns, name) is not None
            obj = store.patch(
                rtype,
                ns,
                name,
                body,
                ctype,
                subresource=sub,
                validation=validation,
                field_manager=query.get("fieldManager"),
                dry_run=dry_run,
            )
            return (200 if existed else 201), obj, "application/json"
        if method == "DELETE":
            if dry_run:
                return 200, store.get(rtype, ns, name), "application/json"
            return 200, store.delete(rtype, ns, name), "application/json"
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed")

    def _watch(
        self, store: ObjectStore, rtype: ResourceType, ns: str | None, name: str | None, query: dict[str, str]
    ) -> None:
        """Stream watch events (chunked JSON lines) until timeoutSeconds, the client leaves or the stand-in stops."""
        labels = query.get("labelSelector")
        fields = ",".join(f for f in (query.get("fieldSelector"), f"metadata.name={name}" if name else "") if f)
        rv_text = query.get("resourceVersion") or ""
        if rv_text not in ("", "0") and not rv_text.isdigit():
            raise ApiError(400, "BadRequest", f'invalid resource version "{rv_text}"')
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds", "").isdigit() else 1800.0
        bookmarks = _true(query.get("allowWatchBookmarks"))
        table = self._wants_table()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        first = [True]

        def emit(event: str, obj: dict[str, Any]) -> None:
            if table and event in ("ADDED", "MODIFIED", "DELETED"):
                obj = self._table(rtype, [obj], obj["metadata"].get("resourceVersion", ""), query, columns=first[0])
                first[0] = False
            data = json.dumps({"type": event, "object": obj}).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def gone() -> None:
            emit("ERROR", ApiError(410, "Expired", f"too old resource version: {rv_text}").body())

        with store._lock:
            seen = store.resource_version
            since = int(rv_text) if rv_text not in ("", "0") else seen
            if rv_text in ("", "0"):
                for obj in store.list(rtype, ns, labels, fields):
                    emit("ADDED", obj)
        deadline = time.monotonic() + timeout
        last_bookmark = time.monotonic()
        standin = self.server.standin
        stopping, generation = standin.stopping, standin.watch_generation
        while time.monotonic() < deadline and not stopping.is_set() and standin.watch_generation == generation:
            events = store.events_since(rtype, ns, since)
            if events is None:
                gone()
                break
            for rv, event, obj in events:
                since = rv
                if matches_label_selector((obj.get("metadata") or {}).get("labels") or {}, labels) and (
                    matches_field_selector(obj, fields)
                ):
                    emit(event, obj)
            if bookmarks and time.monotonic() - last_bookmark > 5:
                last_bookmark = time.monotonic()
                emit(
                    "BOOKMARK",
                    {
                        "kind": rtype.kind,
                        "apiVersion": rtype.api_version,
                        "metadata": {"resourceVersion": str(max(since, store.resource_version))},
                    },
                )
            seen = store.wait_for_change(seen, min(1.0, max(deadline - time.monotonic(), 0.0)))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True

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


_FAULT_STATUS = {
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    500: ("InternalError", "Internal error occurred: injected by the stand-in"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
}


@dataclass
class ApiFault:
    """One injected API failure: the next ``times`` requests matching ``method`` and ``plural`` (None: any;
    watches included) are answered with ``code`` as the apiserver answers it (429 with Retry-After)."""

    code: int
    method: str | None = None
    plural: str | None = None
    times: int = 1
    retry_after: int = 1

    def matches(self, method: str, path: str) -> bool:
        parts = path.strip("/").split("/")
        return (self.method is None or self.method == method) and (self.plural is None or self.plural in parts)


class KubernetesApiStandin:
    """The loopback API server. `with KubernetesApiStandin() as api: api.write_kubeconfig(path)`.

    Faults (tests and the fault matrix): ``add_fault(429, "GET", "rayclusters", times=2)`` answers the next
    matching requests as an overloaded or failing apiserver would; ``drop_watches()`` ends every open watch
    stream at once, as a restarted apiserver or a dropped connection does.

    HTTPS with a CA generated at start (``tls=False``: plain HTTP, for callers that want it); ``crds``: a
    directory of KubeRay's ``ray.io_<plural>.yaml`` CRDs for OpenAPI schemas and field validation.
    """

    def __init__(
        self,
        *,
        store: ObjectStore | None = None,
        token: str | None = None,
        require_token: bool = True,
        port: int = 0,
        tls: bool = True,
        crds: str | Path | None = None,
    ) -> None:
        self.store = store or ObjectStore()
        if crds is not None:
            self.store.crds = catalog.CrdSchemas.load(crds)
        self.token = (token or secrets.token_hex(16)) if require_token else None
        self.requests: list[tuple[str, str, int, float]] = []
        self.tls = LoopbackTls.generate() if tls else None
        self.stopping = threading.Event()
        self.watch_generation = 0  # bumped by drop_watches(): every open watch with an older one ends
        self._faults: list[ApiFault] = []
        self._faults_lock = threading.Lock()
        self._http = LoopbackServer(
            _Handler, self, port=port, name="k8s-standin", tls=self.tls.server_context() if self.tls else None
        )

    # --- faults ---
    def add_fault(
        self, code: int, method: str | None = None, plural: str | None = None, times: int = 1, retry_after: int = 1
    ) -> ApiFault:
        if code not in _FAULT_STATUS:
            raise ValueError(f"fault code {code}: use one of {sorted(_FAULT_STATUS)}")
        if times < 1:
            raise ValueError(f"fault times {times}: use 1 or more")
        fault = ApiFault(code, method.upper() if method else None, plural, times, retry_after)
        with self._faults_lock:
            self._faults.append(fault)
        return fault

    def faults(self) -> list[ApiFault]:
        with self._faults_lock:
            return list(self._faults)

    def clear_faults(self) -> None:
        with self._faults_lock:
            self._faults.clear()

    def take_fault(self, method: str, path: str) -> ApiFault | None:
        with self._faults_lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def drop_watches(self) -> None:
        self.watch_generation += 1
        with self.store.changed:
            self.store.changed.notify_all()

    def start(self) -> KubernetesApiStandin:
        self.stopping.clear()
        self._http.start()
        return self

    def stop(self) -> None:
        self.stopping.set()  # ends open watches
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
        cluster: dict[str, Any] = {"server": self.url}
        if self.tls is not None:
            cluster["certificate-authority-data"] = self.tls.ca_data
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [{"name": "tpuflow-standin", "cluster": cluster}],
            "users": [{"name": "tpuflow-standin", "user": user}],
            "contexts": [
                {
                    "name": "tpuflow-standin",
                    "context": {"cluster": "tpuflow-standin", "user": "tpuflow-standin", "namespace": namespace},
                }
            ],
            "current-context": "tpuflow-standin",
        }

    def ssl_context(self) -> Any:
        """An ssl.SSLContext trusting the stand-in's CA (for urllib); None over plain HTTP."""
        return self.tls.client_context() if self.tls is not None else None

    def write_ca(self, path: str | Path) -> Path | None:
        """The CA certificate as a PEM file (kubernetes.client.Configuration.ssl_ca_cert); None over HTTP."""
        if self.tls is None:
            return None
        target = Path(path)
        target.write_bytes(self.tls.ca_pem)
        return target

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """The kubeconfig (it holds the API token): 0600 from its first byte (created so, then renamed), never
        chmod-ed after a write another local user could have read it in; the folder it is given is kept."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        partial.replace(target)
        return target

    def airflow_connection_env(
        self, conn_id: str, kubeconfig_path: str | Path, namespace: str = "default"
    ) -> dict[str, str]:
        """{"AIRFLOW_CONN_<ID>": json} for a `kubernetes` connection that reaches this stand-in."""
        value = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig_path), "namespace": namespace}}
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(value)}
