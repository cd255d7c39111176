"""Checks and normalisers for the Kubernetes values a manifest carries (names, quantities, env).

Label keys and values follow tpuflow.labels (check_labels and label_safe are re-exported here).

Every check raises UserInputError naming the field, so a bad argument fails before any API call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tpuflow.errors import UserInputError
from tpuflow.labels import check_labels, label_safe

__all__ = [
    "MAX_NAME_LENGTH",
    "check_env",
    "check_labels",  # the Kubernetes label rules live in tpuflow.labels
    "check_name",
    "check_namespace",
    "check_quantities",
    "label_safe",
    "parse_key_values",
    "stringify_ray_group_values",
]

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE]\d+)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# KubeRay derives pod and service names from the CR name ("<name>-head-svc", "<name>-raycluster-xxxxx");
# 40 characters leaves room for those suffixes inside the 63-character limit.
MAX_NAME_LENGTH = 40


def check_name(field: str, name: object, *, max_len: int = MAX_NAME_LENGTH) -> str:
    if not isinstance(name, str) or not _DNS1035.match(name) or len(name) > max_len:
        raise UserInputError(
            field,
            name,
            f"use at most {max_len} lowercase letters, digits and '-', starting with a letter and "
            "ending with a letter or digit (an RFC 1035 label)",
        )
    return name


def check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str) or not _DNS1123_LABEL.match(namespace) or len(namespace) > 63:
        raise UserInputError("namespace", namespace, "use an existing Kubernetes namespace name (RFC 1123 label)")
    return namespace


def check_quantities(
    field: str, resources: Mapping[str, str] | None, *, forbidden: tuple[str, ...] = ()
) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (resources or {}).items():
        if key in forbidden:
            raise UserInputError(f"{field}[{key!r}]", value, f"{key} comes from the TPU slice; remove it")
        text = str(value).strip()
        if not _QUANTITY.match(text):
            raise UserInputError(f"{field}[{key!r}]", value, "give a Kubernetes quantity such as '2', '500m', '8Gi'")
        out[str(key)] = text
    return out


def check_env(field: str, env: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise UserInputError(
                f"{field}[{key!r}]",
                key,
                "environment variable names are letters, digits and '_', not starting with a digit",
            )
        if not isinstance(value, str):
            raise UserInputError(f"{field}[{key!r}]", value, "environment values must be strings; quote numbers")
        out[key] = value
    return out


def parse_key_values(field: str, pairs: list[str] | None) -> dict[str, str]:
    """KEY=VALUE strings (CLI arguments) to a dict."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserInputError(field, pair, "write KEY=VALUE")
        out[key] = value
    return out


def _as_k8s_string(field: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise UserInputError(field, value, "give a string (Kubernetes keeps these values as strings)")


def stringify_ray_group_values(spec: Mapping[str, object]) -> dict[str, object]:
    """The RayCluster spec with rayStartParams and container env values as the strings the CRD and
    the pod API require. A DAG rendered with render_template_as_native_obj turns a manifest's "2" into
    2 (Jinja's native environment evaluates every rendered string), which the API server rejects."""
    out = dict(spec)
    groups: list[tuple[str, dict[str, object]]] = []
    head = out.get("headGroupSpec")
    if isinstance(head, Mapping):
        head_copy: dict[str, object] = dict(head)
        out["headGroupSpec"] = head_copy
        groups.append(("headGroupSpec", head_copy))
    workers = out.get("workerGroupSpecs")
    if isinstance(workers, list):
        worker_copies: list[object] = [dict(g) if isinstance(g, Mapping) else g for g in workers]
        out["workerGroupSpecs"] = worker_copies
        groups += [(f"workerGroupSpecs[{i}]", g) for i, g in enumerate(worker_copies) if isinstance(g, dict)]
    for where, group in groups:
        params = group.get("rayStartParams")
        if isinstance(params, Mapping):
            group["rayStartParams"] = {k: _as_k8s_string(f"{where}.rayStartParams.{k}", v) for k, v in params.items()}
        template = group.get("template")
        if not isinstance(template, Mapping):
            continue
        pod_spec = template.get("spec")
        if not isinstance(pod_spec, Mapping):
            continue
        containers = []
        for c in pod_spec.get("containers") or []:
            if isinstance(c, Mapping) and isinstance(c.get("env"), list):
                env = [
                    {**e, "value": _as_k8s_string(f"{where}.env.{e.get('name')}", e["value"])}
                    if isinstance(e, Mapping) and "value" in e
                    else e
                    for e in c["env"]
                ]
                c = {**c, "env": env}
            containers.append(c)
        group["template"] = {**template, "spec": {**pod_spec, "containers": containers}}
    return out
