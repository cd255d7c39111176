"""Ray token authentication as KubeRay does it for ``spec.authOptions`` (KubeRay >= 1.5.1).

With ``mode: token`` KubeRay creates a Secret (named by ``authOptions.secretName``, else the RayCluster's
name through its ``utils.CheckName``) holding a random token under the key ``auth_token``, owned by the
RayCluster, and sets ``RAY_AUTH_MODE=token`` plus ``RAY_AUTH_TOKEN`` (a ``secretKeyRef`` to that key) on
every Ray container. A user-named Secret is used as given (KubeRay does not create it). The stand-in does
the same, and resolves the ``secretKeyRef`` for the Ray processes it launches the way the kubelet would.
``enableK8sTokenAuth`` (Ray validating Kubernetes credentials through TokenReview) is not simulated.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import Any

from tpuflow_rehearsal.standins.kuberay_controller.state import owner_ref
from tpuflow_rehearsal.standins.kubernetes_api import CORE_TYPES, ObjectStore

SECRETS = CORE_TYPES["secrets"]
TOKEN_KEY = "auth_token"
MODE_ENV, TOKEN_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"


def auth_mode(spec: Mapping[str, Any]) -> str:
    return str((spec.get("authOptions") or {}).get("mode") or "disabled")


def check_name(name: str) -> str:
    """KubeRay's utils.CheckName: the last 50 characters; a leading digit or punctuation becomes "r"."""
    name = name[-50:]
    return f"r{name[1:]}" if name and not name[0].isalpha() else name


def secret_name(obj: Mapping[str, Any]) -> str:
    auth = (obj.get("spec") or {}).get("authOptions") or {}
    return str(auth.get("secretName") or check_name(obj["metadata"]["name"]))


def ensure_secret(store: ObjectStore, obj: Mapping[str, Any]) -> str | None:
    """Create the token Secret of a token-mode RayCluster (once); the Secret's name, None when auth is off."""
    spec = obj.get("spec") or {}
    if auth_mode(spec) != "token":
        return None
    ns, name = obj["metadata"]["namespace"], secret_name(obj)
    if (spec.get("authOptions") or {}).get("secretName"):
        return name  # the user's own Secret
    if store.find(SECRETS, ns, name) is None:
        token = base64.b64encode(secrets.token_urlsafe(32).encode()).decode()
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"ray.io/cluster": obj["metadata"]["name"]},
                "ownerReferences": [owner_ref(obj)],
            },
            "data": {TOKEN_KEY: token},
        }
        store.upsert(SECRETS, ns, body)
    return name


def container_env(secret: str) -> list[dict[str, Any]]:
    """The variables KubeRay sets on every Ray container of a token-mode cluster."""
    return [
        {"name": MODE_ENV, "value": "token"},
        {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": TOKEN_KEY}}},
    ]


def with_auth_env(env: list[dict[str, Any]], secret: str) -> list[dict[str, Any]]:
    """A container's env with KubeRay's auth variables replacing any of the same names."""
    return [*(e for e in env if e.get("name") not in (MODE_ENV, TOKEN_ENV)), *container_env(secret)]


class ContainerConfigError(Exception):
    """The kubelet cannot build a container's env (CreateContainerConfigError); its message is the kubelet's."""


def resolve_env(store: ObjectStore, namespace: str, env: list[dict[str, Any]]) -> dict[str, str]:
    """A container's env as the kubelet hands it to the process: secretKeyRef values read from the Secret.

    A reference to a missing Secret or key (not marked optional) keeps the container from being created,
    with the kubelet's message, until the Secret appears.
    """
    out: dict[str, str] = {}
    for item in env:
        if "value" in item:
            out[item["name"]] = str(item["value"])
            continue
        ref = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name") and ref.get("key"):
            secret = store.find(SECRETS, namespace, ref["name"])
            data = (secret or {}).get("data") or {}
            if ref["key"] in data:
                out[item["name"]] = base64.b64decode(data[ref["key"]]).decode()
            elif ref.get("optional"):
                continue
            elif secret is None:
                raise ContainerConfigError(f'secret "{ref["name"]}" not found')
            else:
                raise ContainerConfigError(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
    return out
