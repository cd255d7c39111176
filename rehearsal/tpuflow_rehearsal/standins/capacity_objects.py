"""What the played GKE autoscaler (tpuflow_rehearsal.standins.capacity) reads and writes in Kubernetes, over either
control plane: the imitation's object store (``StoreObjects``) or a real API server's REST API (``RestObjects``,
as the autoscaler's own identity). The rules are written once, against ``KubeObjects``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from tpuflow_rehearsal.nodes.kube_rest import KubeError, KubeRest
from tpuflow_rehearsal.standins.kubernetes_api import (
    AUTOSCALING_TYPES,
    CORE_TYPES,
    ApiError,
    ObjectStore,
    ResourceType,
    event_body,
    now_iso,
)

Kind = Literal["provisioningrequests", "pods", "podtemplates"]
COMPONENT = "cluster-autoscaler"  # the events' source, as GKE's autoscaler signs them

_TYPES: dict[str, ResourceType] = {
    "provisioningrequests": AUTOSCALING_TYPES["provisioningrequests"],
    "pods": CORE_TYPES["pods"],
    "podtemplates": CORE_TYPES["podtemplates"],
}


class KubeObjects(Protocol):
    def list(self, kind: Kind) -> list[dict[str, Any]]:
        """Every object of the kind, in all namespaces."""
        ...

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None: ...

    def patch_status(self, kind: Kind, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Set these top-level fields of the object's status (nothing when the object is gone)."""
        ...

    def create_event(
        self, namespace: str, involved: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event about ``involved`` (kind, name, namespace, uid); nothing when its namespace is gone."""
        ...


class StoreObjects:
    """KubeObjects over the imitation's ObjectStore."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def list(self, kind: Kind) -> list[dict[str, Any]]:
        return self.store.list(_TYPES[kind])

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        return self.store.find(_TYPES[kind], namespace, name)

    def patch_status(self, kind: Kind, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.store.mutate(_TYPES[kind], namespace, name, lambda obj: obj.setdefault("status", {}).update(status))

    def create_event(
        self, namespace: str, involved: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        try:
            self.store.record_event(namespace, involved, event_type, reason, message, COMPONENT)
        except ApiError:
            pass


class RestObjects:
    """KubeObjects over a real API server (KubeRest with the autoscaler's token)."""

    def __init__(self, api: KubeRest) -> None:
        self.api = api

    @staticmethod
    def _path(kind: Kind, namespace: str | None = None, name: str | None = None) -> str:
        rtype = _TYPES[kind]
        root = f"/apis/{rtype.group}/{rtype.version}" if rtype.group else f"/api/{rtype.version}"
        where = f"/namespaces/{urllib.parse.quote(namespace)}" if namespace else ""
        return f"{root}{where}/{rtype.plural}" + (f"/{urllib.parse.quote(name)}" if name else "")

    def list(self, kind: Kind) -> list[dict[str, Any]]:
        return self.api.items(self._path(kind))

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.api.request("GET", self._path(kind, namespace, name))
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def patch_status(self, kind: Kind, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        try:
            self.api.merge_patch(f"{self._path(kind, namespace, name)}/status", {"status": dict(status)})
        except KubeError as err:
            if err.status != 404:
                raise

    def create_event(
        self, namespace: str, involved: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        body = {
            **event_body(involved, event_type, reason, message, COMPONENT, now_iso()),
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "reportingComponent": COMPONENT,
        }
        try:
            self.api.request("POST", f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/events", body)
        except KubeError as err:
            gone = err.status == 404 or (err.status == 403 and "being terminated" in str(err))
            if not gone:
                raise
