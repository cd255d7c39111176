"""ProvisioningRequests and PodTemplates on the cluster: the Kubernetes layer's hooks (same targets, same
auth) with the ProvisioningRequest API group.

``CapacityHook`` / ``GKECapacityHook`` extend tpuflow.kubernetes.hooks' ``KubeObjectsHook`` /
``GKEKubeObjectsHook`` (a ``kubernetes`` connection, or a GKE endpoint through the google provider);
``AsyncCapacityHook`` / ``GKEAsyncCapacityHook`` the async ones the triggers poll with. Objects come
back as plain JSON dicts; a missing object is None (get) or False (delete). A ProvisioningRequest owns no
pods, so it is deleted with background propagation: gone when the call returns, not when the garbage collector
next gets to its foreground finalizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client as async_client

from tpuflow.capacity.provisioning_request import GROUP, PLURAL, VERSION
from tpuflow.kubernetes.hooks import (
    DELETED,
    AsyncKubeObjectsHook,
    GKEAsyncKubeObjectsHook,
    GKEKubeObjectsHook,
    KubeObjectsHook,
    await_unless_missing,
    generic_api_retry,
    unless_missing,
)
from tpuflow.labels import kept_metadata_patch


class CapacityHook(KubeObjectsHook):
    """ProvisioningRequests (autoscaling.x-k8s.io/v1) and core/v1 PodTemplates, plus the layer's core reads."""

    group, version = GROUP, VERSION

    def get_provisioning_request(self, name: str, namespace: str) -> dict[str, Any] | None:
        return self.get(PLURAL, name, namespace)

    def create_provisioning_request(self, body: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        return dict(self.create_custom_object(GROUP, VERSION, PLURAL, dict(body), namespace))

    def delete_provisioning_request(self, name: str, namespace: str) -> bool:
        return self.delete(PLURAL, name, namespace, foreground=False)

    def get_pod_template(self, name: str, namespace: str) -> dict[str, Any] | None:
        found = unless_missing(lambda: self.core_v1_client.read_namespaced_pod_template(name, namespace), None)
        return None if found is None else self._plain(found)

    def create_pod_template(self, body: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        return self._plain(self.core_v1_client.create_namespaced_pod_template(namespace, dict(body)))

    def pod_template_names(self, namespace: str, label_selector: str) -> list[str]:
        found = self.core_v1_client.list_namespaced_pod_template(namespace, label_selector=label_selector)
        return [item.metadata.name for item in found.items]

    def delete_pod_template(self, name: str, namespace: str) -> bool:
        answer = unless_missing(lambda: self.core_v1_client.delete_namespaced_pod_template(name, namespace), DELETED)
        return answer is not DELETED

    # --- the kept mark (a keep_endpoint teardown; tpuflow.labels.kept_metadata_patch): False when it does not exist
    @generic_api_retry
    def mark_provisioning_request_kept(self, name: str, namespace: str) -> bool:

        client, patch = self.custom_object_client, kept_metadata_patch()
        found = unless_missing(
            lambda: client.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch), None
        )
        return found is not None

    @generic_api_retry
    def mark_pod_template_kept(self, name: str, namespace: str) -> bool:

        patch = kept_metadata_patch()
        found = unless_missing(lambda: self.core_v1_client.patch_namespaced_pod_template(name, namespace, patch), None)
        return found is not None


class GKECapacityHook(CapacityHook, GKEKubeObjectsHook, gke_variant_of=CapacityHook):
    """CapacityHook authenticated to a GKE endpoint (GKEKubeObjectsHook's arguments)."""


class AsyncCapacityHook(AsyncKubeObjectsHook):
    """The ProvisioningRequest read the triggers poll, plus the layer's async core reads."""

    group, version = GROUP, VERSION

    async def get_provisioning_request(self, name: str, namespace: str) -> dict[str, Any] | None:
        return await self.get(PLURAL, name, namespace)

    async def delete_provisioning_request(self, name: str, namespace: str) -> bool:
        return await self.delete(PLURAL, name, namespace, foreground=False)

    @generic_api_retry
    async def delete_pod_template(self, name: str, namespace: str) -> bool:
        async with self.get_conn() as api:
            request = async_client.CoreV1Api(api).delete_namespaced_pod_template(name, namespace)
            return await await_unless_missing(request, DELETED) is not DELETED


class GKEAsyncCapacityHook(AsyncCapacityHook, GKEAsyncKubeObjectsHook, gke_variant_of=AsyncCapacityHook):
    """AsyncCapacityHook authenticated to a GKE endpoint (GKEAsyncKubeObjectsHook's arguments)."""


class SyncCapacityReader:
    """The reads of the capacity waits over the synchronous hook (the non-deferrable path)."""

    def __init__(self, hook: CapacityHook) -> None:
        self.hook = hook

    async def get_provisioning_request(self, name: str, namespace: str) -> dict[str, Any] | None:
        return self.hook.get_provisioning_request(name, namespace)

    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self.hook.pods(namespace, label_selector)

    async def events_for(self, namespace: str, names: list[str]) -> list[dict[str, Any]]:
        return self.hook.events_for(namespace, names)
