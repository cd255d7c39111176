"""KubeRay's custom objects (``ray.io/v1``): the Kubernetes layer's hooks (tpuflow.kubernetes.hooks) with
KubeRay's API group.

``KubeRayHook`` (synchronous: the operators' create, adopt, update, delete and diagnostics) and
``AsyncKubeRayHook`` (the triggers' polling), on a ``kubernetes`` connection; ``GKEKubeRayHook`` /
``GKEAsyncKubeRayHook`` reach a GKE endpoint through the google provider's GKE Kubernetes hooks.
"""

from __future__ import annotations

from tpuflow.kuberay import GROUP, VERSION
from tpuflow.kubernetes.hooks import (
    AsyncKubeObjectsHook,
    GKEAsyncKubeObjectsHook,
    GKEKubeObjectsHook,
    KubeObjectsHook,
)


class KubeRayHook(KubeObjectsHook):
    """The KubeRay calls the operators make, on a ``kubernetes`` connection (``conn_id``).

    :param conn_id: the ``kubernetes`` connection (see the cncf-kubernetes provider's KubernetesHook).
    """

    group, version = GROUP, VERSION


class GKEKubeRayHook(KubeRayHook, GKEKubeObjectsHook, gke_variant_of=KubeRayHook):
    """KubeRayHook authenticated to a GKE cluster endpoint (GKEKubeObjectsHook's arguments)."""


class AsyncKubeRayHook(AsyncKubeObjectsHook):
    """The reads the triggers poll with, and the trigger's kill-time delete, on kubernetes_asyncio.

    :param conn_id: the ``kubernetes`` connection (see the cncf-kubernetes provider's AsyncKubernetesHook).
    """

    group, version = GROUP, VERSION


class GKEAsyncKubeRayHook(AsyncKubeRayHook, GKEAsyncKubeObjectsHook, gke_variant_of=AsyncKubeRayHook):
    """AsyncKubeRayHook authenticated to a GKE endpoint (GKEAsyncKubeObjectsHook's arguments)."""
