"""What a container's process sees, as a kubelet resolves it: the pod's env (values, $(VAR) references, the
downward API, Secret and ConfigMap keys, envFrom) over the image's environment, plus what a GKE TPU VM's
metadata server tells Ray (TPU_ACCELERATOR_TYPE, TPU_TOPOLOGY) on TPU nodes.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from tpuflow_rehearsal.nodes.kube_rest import KubeError

_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)|\$\$")
# GCE's accelerator-type names (what Ray reads as TPU_ACCELERATOR_TYPE) per GKE accelerator label: the name, and
# whether the number counts TensorCores (two per chip) rather than chips
_GCE_TYPES = {
    "tpu-v4-podslice": ("v4", 2),
    "tpu-v5-lite-podslice": ("v5litepod", 1),
    "tpu-v5p-slice": ("v5p", 2),
    "tpu-v6e-slice": ("v6e", 1),
    "tpu7x": ("tpu7x", 2),
}

Lookup = Callable[[str, str, str], "str | None"]  # (kind "secrets"|"configmaps", name, key) -> value


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a defined VAR is replaced, an undefined one kept, $$ is a literal $."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _REF.sub(one, value)


def _field(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.podIPs": ",".join(ip.get("ip", "") for ip in status.get("podIPs") or []),
        "status.hostIPs": ",".join(ip.get("ip", "") for ip in status.get("hostIPs") or []),
    }
    if path in simple:
        return str(simple[path] or "")
    found = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if found:
        return str((meta.get(found.group(1)) or {}).get(found.group(2), ""))
    return ""


def _quantity(value: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def _resource(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    part, _, name = str(ref.get("resource", "")).partition(".")
    raw = ((container.get("resources") or {}).get(part) or {}).get(name)
    if raw is None:
        return "0"
    divisor = _quantity(str(ref.get("divisor") or "1"))
    return str(math.ceil(_quantity(str(raw)) / divisor))


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], lookup: Lookup, base: Mapping[str, str]
) -> dict[str, str]:
    """The container's environment: ``base`` (the image's), then envFrom, then env in order."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for kind, ref_key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
            ref = source.get(ref_key)
            if ref:
                for key, ref_value in _all_keys(lookup, kind, str(ref.get("name", ""))).items():
                    env[prefix + key] = ref_value
    for item in container.get("env") or []:
        name = str(item.get("name"))
        if "value" in item:
            env[name] = expand(str(item.get("value") or ""), env)
            continue
        source = item.get("valueFrom") or {}
        value: str | None = None
        if "fieldRef" in source:
            value = _field(pod, str(source["fieldRef"].get("fieldPath", "")))
        elif "resourceFieldRef" in source:
            value = _resource(container, source["resourceFieldRef"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = lookup("secrets", str(ref.get("name")), str(ref.get("key")))
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            value = lookup("configmaps", str(ref.get("name")), str(ref.get("key")))
        if value is not None:
            env[name] = value
    return env


def _all_keys(lookup: Lookup, kind: str, name: str) -> dict[str, str]:
    value = lookup(kind, name, "")
    return {} if value is None else dict(json.loads(value))


def api_lookup(api: Any, namespace: str) -> Lookup:
    """Secret and ConfigMap keys read through the API (key "": the whole object's data as JSON)."""

    def lookup(kind: str, name: str, key: str) -> str | None:
        try:
            obj = api.request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except KubeError as err:
            if err.status == 404:
                return None
            raise
        data = dict(obj.get("data") or {})
        if kind == "secrets":
            data = {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
        if not key:
            return json.dumps(data)
        return data.get(key)

    return lookup


def tpu_metadata(node_labels: Mapping[str, str]) -> dict[str, str]:
    """What Ray reads from a TPU VM's metadata server, as environment: its slice's accelerator type and topology."""
    accelerator = node_labels.get("cloud.google.com/gke-tpu-accelerator", "")
    topology = node_labels.get("cloud.google.com/gke-tpu-topology", "")
    if accelerator not in _GCE_TYPES or not topology:
        return {}
    name, per_chip = _GCE_TYPES[accelerator]
    chips = math.prod(int(d) for d in topology.lower().split("x"))
    return {"TPU_ACCELERATOR_TYPE": f"{name}-{chips * per_chip}", "TPU_TOPOLOGY": topology}
