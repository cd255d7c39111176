"""What the Kubernetes stand-in publishes about its resource types, as a real apiserver does for kubectl.

- discovery details: short names, categories, verbs (``svc``, ``po``, ``rayclusters`` in ``all``);
- table output (``Accept: application/json;as=Table``): the core printers' columns for pods, services,
  events, ...; KubeRay's ``additionalPrinterColumns`` for its custom resources;
- OpenAPI v3 (``/openapi/v3``): one document per group-version with every path's operations, the
  ``x-kubernetes-group-version-kind`` extensions and the ``fieldValidation`` parameter kubectl looks for,
  and the CRD schemas;
- CRD schemas (KubeRay's ``ray.io_<plural>.yaml``, or ``.yaml.gz`` as tpuflow_rehearsal.standins.kuberay_crds ships
  them, from a directory given at start): server-side field validation as the apiserver does it (unknown
  fields pruned with a warning, refused under ``fieldValidation=Strict``; schema violations 422 Invalid).

The printer columns of KubeRay's CRDs are written here from KubeRay v1.7's CRDs so a stand-in started
without the CRD files still prints them; with the files, theirs are used.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _col(name: str, json_path: str, type_: str = "string", priority: int = 0) -> dict[str, Any]:
    return {"name": name, "jsonPath": json_path, "type": type_, "priority": priority}


# KubeRay v1.7 ray-operator/config/crd/bases: spec.versions[v1].additionalPrinterColumns
KUBERAY_PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "rayclusters": [
        _col("desired workers", ".status.desiredWorkerReplicas", "integer"),
        _col("available workers", ".status.availableWorkerReplicas", "integer"),
        _col("cpus", ".status.desiredCPU"),
        _col("memory", ".status.desiredMemory"),
        _col("gpus", ".status.desiredGPU"),
        _col("tpus", ".status.desiredTPU", priority=1),
        _col("status", ".status.state"),
        _col("age", ".metadata.creationTimestamp", "date"),
        _col("head pod IP", ".status.head.podIP", priority=1),
        _col("head service IP", ".status.head.serviceIP", priority=1),
    ],
    "rayservices": [
        _col("service status", ".status.serviceStatus"),
        _col("num serve endpoints", ".status.numServeEndpoints"),
    ],
    "rayjobs": [
        _col("job status", ".status.jobStatus"),
        _col("deployment status", ".status.jobDeploymentStatus"),
        _col("ray cluster name", ".status.rayClusterName"),
        _col("start time", ".status.startTime"),
        _col("end time", ".status.endTime"),
        _col("age", ".metadata.creationTimestamp", "date"),
    ],
}


# --- ages and JSON paths -----------------------------------------------------------------------------
def human_age(stamp: str | None, now: datetime | None = None) -> str:
    """kubectl's short duration ("45s", "5m10s", "3h", "2d") since an RFC 3339 timestamp."""
    if not stamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    seconds = max(int(((now or datetime.now(UTC)) - then).total_seconds()), 0)
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def json_path(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath (".status.head.podIP", ".spec.ports[0].port"); None when absent."""
    cur = obj
    for name, index in _STEP.findall(path.strip().lstrip("$").strip("{}")):
        if name:
            cur = cur.get(name) if isinstance(cur, Mapping) else None
        else:
            cur = cur[int(index)] if isinstance(cur, list) and int(index) < len(cur) else None
        if cur is None:
            return None
    return cur


# --- core printers (k8s.io/kubernetes/pkg/printers/internalversion, the columns kubectl shows) -------------
def _pod_cells(pod: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    containers = (pod.get("spec") or {}).get("containers") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    reason = status.get("phase") or "Unknown"
    for c in statuses:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    return (
        [f"{ready}/{len(containers)}", reason, restarts],
        [status.get("podIP") or "<none>", (pod.get("spec") or {}).get("nodeName") or "<none>", "<none>", "<none>"],
    )


def _service_ports(svc: Mapping[str, Any]) -> str:
    ports = (svc.get("spec") or {}).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _column_definitions(columns: Iterable[tuple[str, str, int]]) -> list[dict[str, Any]]:
    return [
        {"name": name, "type": type_, "format": "name" if name == "Name" else "", "description": "", "priority": prio}
        for name, type_, prio in columns
    ]


def core_table_columns(plural: str) -> list[dict[str, Any]]:
    columns = {
        "pods": [
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        "services": [
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Cluster-IP", "string", 0),
            ("External-IP", "string", 0),
            ("Port(s)", "string", 0),
            ("Age", "string", 0),
            ("Selector", "string", 1),
        ],
        "events": [
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Message", "string", 0),
            ("Source", "string", 1),
            ("First Seen", "string", 1),
            ("Count", "string", 1),
            ("Name", "string", 1),
        ],
        "namespaces": [("Name", "string", 0), ("Status", "string", 0), ("Age", "string", 0)],
        "secrets": [("Name", "string", 0), ("Type", "string", 0), ("Data", "string", 0), ("Age", "string", 0)],
        "configmaps": [("Name", "string", 0), ("Data", "string", 0), ("Age", "string", 0)],
    }.get(plural, [("Name", "string", 0), ("Age", "string", 0)])
    return _column_definitions(columns)


def core_table_cells(plural: str, obj: Mapping[str, Any]) -> list[Any]:
    meta = obj.get("metadata") or {}
    name, age = meta.get("name", ""), human_age(meta.get("creationTimestamp"))
    if plural == "pods":
        main, wide = _pod_cells(obj)
        return [name, *main, age, *wide]
    if plural == "services":
        spec = obj.get("spec") or {}
        selector = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items()) or "<none>"
        return [
            name,
            spec.get("type", "ClusterIP"),
            spec.get("clusterIP") or "<none>",
            "<none>",
            _service_ports(obj),
            age,
            selector,
        ]
    if plural == "events":
        inv = obj.get("involvedObject") or {}
        source = (obj.get("source") or {}).get("component", "")
        return [
            human_age(obj.get("lastTimestamp") or meta.get("creationTimestamp")),
            obj.get("type", ""),
            obj.get("reason", ""),
            f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}",
            obj.get("message", ""),
            source,
            human_age(obj.get("firstTimestamp") or meta.get("creationTimestamp")),
            int(obj.get("count") or 1),
            name,
        ]
    if plural == "namespaces":
        return [name, (obj.get("status") or {}).get("phase", "Active"), age]
    if plural == "secrets":
        return [name, obj.get("type", "Opaque"), len(obj.get("data") or {}), age]
    if plural == "configmaps":
        return [name, len(obj.get("data") or {}) + len(obj.get("binaryData") or {}), age]
    return [name, age]


def custom_table_columns(printer_columns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}]
    for col in printer_columns or [_col("Age", ".metadata.creationTimestamp", "date")]:
        out.append(
            {
                "name": col["name"],
                "type": col.get("type", "string"),
                "format": col.get("format", ""),
                "description": col.get("description", ""),
                "priority": int(col.get("priority", 0)),
            }
        )
    return out


def custom_table_cells(printer_columns: list[dict[str, Any]], obj: Mapping[str, Any]) -> list[Any]:
    cells: list[Any] = [(obj.get("metadata") or {}).get("name", "")]
    for col in printer_columns or [_col("Age", ".metadata.creationTimestamp", "date")]:
        value = json_path(obj, col["jsonPath"])
        if col.get("type") == "date":
            value = human_age(value) if value else None
        elif isinstance(value, (dict, list)):
            value = json.dumps(value)
        cells.append(value)
    return cells


# --- CRD schemas ------------------------------------------------------------------------------------
@dataclass
class CrdSchemas:
    """KubeRay's CRDs as read from their YAML files: v1 schema and printer columns per plural."""

    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    printer_columns: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def load(cls, directory: str | Path | None) -> CrdSchemas:
        """ray.io_<plural>.yaml (or .yaml.gz) files of `directory`; empty (no schema validation) when absent."""
        out = cls(printer_columns={k: list(v) for k, v in KUBERAY_PRINTER_COLUMNS.items()})
        if directory is None or not Path(directory).is_dir():
            return out
        for path in crd_files(directory):
            crd = _read_crd(str(path.resolve()), path.stat().st_mtime_ns)
            plural = crd["spec"]["names"]["plural"]
            version = next((v for v in crd["spec"]["versions"] if v["name"] == "v1"), None)
            if version is None:
                continue
            out.schemas[plural] = version["schema"]["openAPIV3Schema"]
            out.printer_columns[plural] = version.get("additionalPrinterColumns") or []
        out.source = str(Path(directory).resolve()) if out.schemas else ""
        return out

    def schema(self, plural: str) -> dict[str, Any] | None:
        return self.schemas.get(plural)


def crd_files(directory: str | Path) -> list[Path]:
    """KubeRay's CRD files in `directory`: ray.io_<plural>.yaml, or gzipped as the package ships them."""
    folder = Path(directory)
    return sorted([*folder.glob("ray.io_*.yaml"), *folder.glob("ray.io_*.yaml.gz")])


def holds_crds(directory: str | Path) -> bool:
    """Whether `directory` holds KubeRay's RayCluster CRD (the one every other use of the CRDs comes with)."""
    return any((Path(directory) / f"ray.io_rayclusters.yaml{gz}").is_file() for gz in ("", ".gz"))


@functools.lru_cache(maxsize=16)
def _read_crd(path: str, mtime_ns: int) -> dict[str, Any]:
    """A CRD file, parsed once per version of the file (schemas are only read, never changed)."""
    raw = gzip.decompress(Path(path).read_bytes()) if path.endswith(".gz") else Path(path).read_bytes()
    crd: dict[str, Any] = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # a CRD: a mapping
    return crd


def unknown_fields(schema: Mapping[str, Any], obj: Any, path: str = "") -> list[str]:
    """Paths (``spec.headGroupSpec.foo``) of fields a structural schema does not know (would be pruned)."""
    if isinstance(obj, Mapping):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out: list[str] = []
        for key, value in obj.items():
            child = f"{path}.{key}" if path else key
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and key in props:
                out += unknown_fields(props[key], value, child)
            elif isinstance(extra, Mapping):
                out += unknown_fields(extra, value, child)
            elif props is not None or extra is False:
                out.append(child)
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        return [u for i, item in enumerate(obj) for u in unknown_fields(schema["items"], item, f"{path}[{i}]")]
    return []


def prune(schema: Mapping[str, Any], obj: Any, path: str = "") -> None:
    """Drop the fields `unknown_fields` names, in place (the apiserver's pruning of custom resources)."""
    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key in list(obj):
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and key in props:
                prune(props[key], obj[key], f"{path}.{key}")
            elif isinstance(extra, Mapping):
                prune(extra, obj[key], f"{path}.{key}")
            elif props is not None or extra is False:
                del obj[key]
    elif isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        for item in obj:
            prune(schema["items"], item, path)


def apply_defaults(schema: Mapping[str, Any], obj: Any) -> None:
    """The structural schema's ``default`` values for absent fields, in place (applied before validation)."""
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in obj and "default" in sub:
                obj[key] = json.loads(json.dumps(sub["default"]))
            if key in obj:
                apply_defaults(sub, obj[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key, value in obj.items():
                if key not in (schema.get("properties") or {}):
                    apply_defaults(extra, value)
    elif isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        for item in obj:
            apply_defaults(schema["items"], item)


def _field_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def schema_violations(schema: Mapping[str, Any], obj: Mapping[str, Any]) -> list[dict[str, str]]:
    """The apiserver's causes for a custom resource its CRD schema refuses (type, enum, required, pattern...)."""
    import jsonschema

    body = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    trimmed = {k: v for k, v in (schema.get("properties") or {}).items() if k not in ("metadata", "status")}
    validator = jsonschema.Draft7Validator({**schema, "properties": trimmed})
    causes = []
    for err in sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path))):
        where = _field_path(err.absolute_path) or "<root>"
        value = (
            json.dumps(err.instance)
            if not isinstance(err.instance, (dict, list))
            else f'"{type(err.instance).__name__}"'
        )
        if err.validator == "type":
            expected = err.validator_value
            message = f'Invalid value: {value}: {where} in body must be of type {expected}: "{_go_type(err.instance)}"'
            reason = "FieldValueTypeInvalid"
        elif err.validator == "required":
            missing = err.message.split("'")[1] if "'" in err.message else err.message
            where = f"{where}.{missing}" if where != "<root>" else missing
            message, reason = "Required value", "FieldValueRequired"
        elif err.validator == "enum":
            allowed = ", ".join(f'"{v}"' for v in err.validator_value)
            message, reason = f"Unsupported value: {value}: supported values: {allowed}", "FieldValueNotSupported"
        else:
            message, reason = f"Invalid value: {value}: {err.message}", "FieldValueInvalid"
        causes.append({"reason": reason, "message": message, "field": where})
    return causes


def _go_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


# --- OpenAPI v3 ---------------------------------------------------------------------------------------
def _definition_name(group: str, version: str, kind: str) -> str:
    if not group:
        return f"io.k8s.api.core.{version}.{kind}"
    return ".".join(reversed(group.split("."))) + f".{version}.{kind}"


_PARAMS = {
    name: {"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
    for name in (
        "dryRun",
        "fieldManager",
        "fieldValidation",
        "pretty",
        "force",
        "labelSelector",
        "fieldSelector",
        "resourceVersion",
        "watch",
        "timeoutSeconds",
        "limit",
        "continue",
        "allowWatchBookmarks",
    )
}


def _operation(
    gvk: dict[str, str], action: str, params: list[str], schema_ref: str, patch: bool = False
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": f"{action}{gvk['kind']}",
        "parameters": [_PARAMS[p] for p in params],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": schema_ref}}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    }
    if patch:
        op["requestBody"] = {
            "content": {
                ctype: {"schema": {"type": "object"}}
                for ctype in (
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                )
            },
            "required": True,
        }
    elif action in ("post", "put"):
        op["requestBody"] = {"content": {"*/*": {"schema": {"$ref": schema_ref}}}, "required": True}
    return op


def openapi_v3_document(group_version: str, types: Iterable[Any], crds: CrdSchemas) -> dict[str, Any]:
    """The OpenAPI v3 document of one group-version: paths with their operations, and the schemas."""
    group, _, version = group_version.rpartition("/")
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for t in types:
        gvk = {"group": group, "version": version, "kind": t.kind}
        name = _definition_name(group, version, t.kind)
        ref = f"#/components/schemas/{name}"
        schema = dict(crds.schema(t.plural) or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
        schema["x-kubernetes-group-version-kind"] = [gvk]
        schemas[name] = schema
        prefix = f"/apis/{group_version}" if group else f"/api/{version}"
        base = f"{prefix}/namespaces/{{namespace}}/{t.plural}" if t.namespaced else f"{prefix}/{t.plural}"
        paths[base] = {
            "get": _operation(
                gvk, "list", ["labelSelector", "fieldSelector", "watch", "resourceVersion", "limit"], ref
            ),
            "post": _operation(gvk, "post", ["dryRun", "fieldManager", "fieldValidation", "pretty"], ref),
        }
        paths[f"{base}/{{name}}"] = {
            "get": _operation(gvk, "get", ["pretty"], ref),
            "put": _operation(gvk, "put", ["dryRun", "fieldManager", "fieldValidation", "pretty"], ref),
            "patch": _operation(
                gvk, "patch", ["dryRun", "fieldManager", "fieldValidation", "force", "pretty"], ref, True
            ),
            "delete": _operation(gvk, "delete", ["dryRun", "pretty"], ref),
        }
        if t.has_status:
            paths[f"{base}/{{name}}/status"] = {
                "get": _operation(gvk, "get", ["pretty"], ref),
                "patch": _operation(gvk, "patch", ["dryRun", "fieldManager", "fieldValidation", "force"], ref, True),
            }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def document_hash(doc: Mapping[str, Any]) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:64].upper()
