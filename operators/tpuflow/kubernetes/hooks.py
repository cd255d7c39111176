"""The Kubernetes layer's hooks: where the API is (``KubeTarget``), custom objects of one API group and the
core objects (pods, logs, services, Secrets, events), on the providers' Kubernetes hooks.

``KubeObjectsHook`` is a cncf-kubernetes ``KubernetesHook`` (synchronous: creates, adopts, updates, deletes
and diagnostics) and ``AsyncKubeObjectsHook`` an ``AsyncKubernetesHook`` (the triggers' polling, on
kubernetes_asyncio). Their GKE variants add the google provider's ``GKEKubernetesHook`` /
``GKEKubernetesAsyncHook`` authentication, the way the google provider builds its GKE hooks on the cncf
ones. A product (KubeRay's ``ray.io/v1``, capacity's ``autoscaling.x-k8s.io``) subclasses them with its
``group`` and ``version``. Custom objects go through the provider's ``create_custom_object`` /
``get_custom_object`` / ``delete_custom_object`` (with its tenacity retry of transient API errors,
``generic_api_retry``, which the async reads use too); errors are the clients' own ``ApiException``.

Where the Kubernetes API is, serialisable for triggers (``KubeTarget.to_dict()``):

- a ``kubernetes`` connection: extras ``kube_config_path`` | ``kube_config`` | ``in_cluster``,
  ``cluster_context``, ``namespace``, ``disable_verify_ssl``; e.g. for the local stand-in
  ``AIRFLOW_CONN_KUBE_STANDIN='{"conn_type": "kubernetes", "extra": {"kube_config_path": "/tmp/kc"}}'``.
- a GKE cluster: the operator resolves the endpoint and CA certificate from
  ``gke_cluster={"project_id", "location", "cluster_name"}`` (``resolve_gke_target``).

Objects come back as plain JSON dicts (camelCase, as kubectl shows them), through the clients'
``sanitize_for_serialization``. Heavy imports (kubernetes, providers) happen here, never in an operators
module.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal, Self, TypedDict, TypeVar, cast

import tenacity
from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook, KubernetesHook
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import (
    API_RETRIES,
    TRANSIENT_CONNECTION_ERRORS,
    TRANSIENT_STATUS_CODES,
    WaitRetryAfterOrExponential,
)
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import (
    generic_api_retry as _provider_generic_api_retry,
)
from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook, GKEKubernetesHook
from kubernetes.client import ApiException
from kubernetes_asyncio import client as async_client

from tpuflow.kubernetes.errors import CONFLICT, NOT_FOUND, api_error_parts
from tpuflow.labels import kept_metadata_patch

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# The provider's retry decorator is unannotated; it wraps with tenacity.retry, which keeps the signature.
generic_api_retry: Callable[[F], F] = cast(Callable[[F], F], _provider_generic_api_retry)


def _transient_for_create(exc: BaseException) -> bool:
    """The provider's transient errors, less 409: a create answered AlreadyExists is final (the caller adopts)."""
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUS_CODES and exc.status != CONFLICT
    return isinstance(exc, TRANSIENT_CONNECTION_ERRORS)


# The provider leaves creates unretried (a create sent twice can make two objects). Ours carry deterministic
# names, so a second send is answered 409 and adopted: a 429/5xx or a dropped connection is worth retrying.
create_api_retry = tenacity.retry(
    stop=tenacity.stop_after_attempt(API_RETRIES),
    wait=WaitRetryAfterOrExponential(),
    retry=tenacity.retry_if_exception(_transient_for_create),
    reraise=True,
    before_sleep=tenacity.before_sleep_log(log, logging.WARNING),
)


@dataclass(frozen=True)
class KubeTarget:
    """Where the Kubernetes API is: a kubernetes connection, or a GKE endpoint (cluster_url set)."""

    kubernetes_conn_id: str | None = "kubernetes_default"
    cluster_url: str | None = None
    ssl_ca_cert: str | None = None
    gcp_conn_id: str = "google_cloud_default"
    impersonation_chain: str | tuple[str, ...] | None = None
    use_dns_endpoint: bool = False

    @property
    def gke(self) -> bool:
        return self.cluster_url is not None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if isinstance(self.impersonation_chain, tuple):
            data["impersonation_chain"] = list(self.impersonation_chain)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KubeTarget:
        chain = data.get("impersonation_chain")
        return cls(**{**data, "impersonation_chain": tuple(chain) if isinstance(chain, list) else chain})

    def gke_hook_kwargs(self) -> dict[str, Any]:
        """The arguments the google provider's GKE Kubernetes hooks take."""
        return {
            "cluster_url": self.cluster_url or "",
            "ssl_ca_cert": self.ssl_ca_cert or "",
            "gcp_conn_id": self.gcp_conn_id,
            "impersonation_chain": self.impersonation_chain,
            "use_dns_endpoint": self.use_dns_endpoint,
        }


def resolve_gke_target(
    gke_cluster: Mapping[str, Any], gcp_conn_id: str, impersonation_chain: str | Sequence[str] | None
) -> KubeTarget:
    """Endpoint and CA certificate of a GKE cluster, as the google provider's GKE operators fetch them."""
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook
    from airflow.providers.google.cloud.operators.kubernetes_engine import GKEClusterAuthDetails

    chain = (
        impersonation_chain
        if impersonation_chain is None or isinstance(impersonation_chain, str)
        else tuple(impersonation_chain)
    )
    cluster_hook = GKEHook(gcp_conn_id=gcp_conn_id, location=gke_cluster["location"], impersonation_chain=chain)
    use_dns = bool(gke_cluster.get("use_dns_endpoint", False))
    url, ca = GKEClusterAuthDetails(
        cluster_name=gke_cluster["cluster_name"],
        project_id=gke_cluster["project_id"],
        use_internal_ip=bool(gke_cluster.get("use_internal_ip", False)),
        use_dns_endpoint=use_dns,
        cluster_hook=cluster_hook,
    ).fetch_cluster_info()
    return KubeTarget(
        kubernetes_conn_id=None,
        cluster_url=url,
        ssl_ca_cert=ca,
        gcp_conn_id=gcp_conn_id,
        impersonation_chain=chain,
        use_dns_endpoint=use_dns,
    )


# --- what both hooks do with the answers ------------------------------------------------------------------
T = TypeVar("T")
D = TypeVar("D")


def unless_missing(call: Callable[[], T], default: D) -> T | D:
    """The call's answer, or `default` when the API answers 404 Not Found (other errors propagate)."""
    try:
        return call()
    except ApiException as exc:
        if exc.status != NOT_FOUND:
            raise
        return default


async def await_unless_missing(call: Awaitable[T], default: D) -> T | D:
    """`unless_missing` for kubernetes_asyncio calls."""
    try:
        return await call
    except async_client.ApiException as exc:
        if exc.status != NOT_FOUND:
            raise
        return default


def as_dict(obj: Any) -> dict[str, Any] | None:
    return None if obj is None else dict(obj)


def _items(serialized: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(item) for item in serialized.get("items") or []]


def _involving(events: Iterable[Mapping[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    wanted = set(names)
    return [dict(e) for e in events if (e.get("involvedObject") or {}).get("name") in wanted]


def _secret_value(data: Mapping[str, Any] | None, key: str) -> str | None:
    """One key of a Secret's data (base64, as the API returns it), decoded; None when absent."""

    value = (data or {}).get(key)
    return base64.b64decode(value).decode().strip() if value else None


def _log_kwargs(lines: int, container: str | None) -> dict[str, Any]:
    return {"tail_lines": lines, **({"container": container} if container else {})}


def _log_lines(text: Any) -> list[str]:
    return str(text).splitlines()


def _no_log(exc: BaseException) -> list[str]:
    return [f"(no log: {api_error_parts(exc)[2]})"]


class TargetedHook:
    """A hook family with a GKE variant: ``for_target`` builds the one a KubeTarget needs. The variant names
    the hook it stands in for (``class GKEKubeRayHook(KubeRayHook, GKEKubeObjectsHook, gke_variant_of=KubeRayHook)``).
    """

    gke_variant: ClassVar[type[TargetedHook]]

    def __init_subclass__(cls, *, gke_variant_of: type[TargetedHook] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if gke_variant_of is not None:
            gke_variant_of.gke_variant = cls

    @classmethod
    def for_target(cls, target: KubeTarget) -> Self:
        """The GKE variant for a GKE endpoint (the google provider's GKE hooks), else this hook on the
        ``kubernetes`` connection."""
        if target.gke:
            return cls.gke_variant(**target.gke_hook_kwargs())  # type: ignore[return-value]
        return cls(conn_id=target.kubernetes_conn_id)  # type: ignore[call-arg]


class DeleteOptions(TypedDict):
    """The keyword arguments of a custom object delete that tpuflow sends."""

    propagation_policy: Literal["Foreground", "Background"]


DELETED = object()
# Foreground: the object stays (deletionTimestamp, finalizer foregroundDeletion) until the garbage collector has
# deleted the dependents that block it (a RayCluster's pods and Services), so a wait for it to be gone ends when its
# pods have stopped, not while their processes still hold the slice's chips (a RayService: tpuflow.kuberay.kinds).
FOREGROUND_DELETE: DeleteOptions = {"propagation_policy": "Foreground"}
BACKGROUND_DELETE: DeleteOptions = {"propagation_policy": "Background"}


class KubeObjectsHook(TargetedHook, KubernetesHook):
    """Custom objects of one API group (``group`` / ``version``, set by each product's subclass), and the
    core objects (pods, events, services, secrets, logs), on a ``kubernetes`` connection (``conn_id``).

    :param conn_id: the ``kubernetes`` connection (see the cncf-kubernetes provider's KubernetesHook).
    """

    group: ClassVar[str] = ""
    version: ClassVar[str] = ""

    def default_namespace(self) -> str:
        return str(self.get_namespace() or "default")

    # --- custom objects (group/version), through the provider's calls ---
    def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        return as_dict(
            unless_missing(lambda: self.get_custom_object(self.group, self.version, plural, name, namespace), None)
        )

    @generic_api_retry
    def objects(self, plural: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The objects of ``plural`` in ``namespace`` that carry these labels (the provider has no custom-object
        list)."""
        found = self.custom_object_client.list_namespaced_custom_object(
            self.group, self.version, namespace, plural, label_selector=label_selector
        )
        return _items(found)

    @create_api_retry
    def create(self, plural: str, body: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Create a named object; a 409 (it exists, perhaps from a retried send) is the caller's to adopt."""
        return dict(self.create_custom_object(self.group, self.version, plural, dict(body), namespace))

    @generic_api_retry
    def patch(self, plural: str, name: str, patch: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """A merge patch through the client (the provider has no custom-object patch), retried on transient
        API errors as the provider's own calls are (a merge patch can be sent twice)."""
        return dict(
            self.custom_object_client.patch_namespaced_custom_object(
                self.group, self.version, namespace, plural, name, dict(patch)
            )
        )

    def mark_kept(self, plural: str, name: str, namespace: str) -> bool:
        """Label an object kept (a ``keep_endpoint`` teardown: tpuflow.labels.kept_metadata_patch, so the orphan
        reaper leaves it); False when it does not exist."""

        return unless_missing(lambda: self.patch(plural, name, kept_metadata_patch(), namespace), None) is not None

    def delete(self, plural: str, name: str, namespace: str, *, foreground: bool = True) -> bool:
        """Request deletion (foreground propagation: gone once its pods are; background: gone at once, its pods
        removed after it); False when it was already gone."""
        policy = FOREGROUND_DELETE if foreground else BACKGROUND_DELETE
        answer = unless_missing(
            lambda: self.delete_custom_object(self.group, self.version, plural, name, namespace, **policy), DELETED
        )
        return answer is not DELETED

    # --- core objects, as plain JSON ---
    def _plain(self, model: Any) -> dict[str, Any]:
        return dict(self.api_client.sanitize_for_serialization(model))

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return _items(self._plain(self.core_v1_client.list_namespaced_pod(namespace, label_selector=label_selector)))

    def events_for(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
        return _involving(_items(self._plain(self.core_v1_client.list_namespaced_event(namespace))), names)

    def get_service(self, name: str, namespace: str) -> dict[str, Any] | None:
        found = unless_missing(lambda: self.core_v1_client.read_namespaced_service(name, namespace), None)
        return None if found is None else self._plain(found)

    def secret_value(self, name: str, namespace: str, key: str) -> str | None:
        """One value of a Secret (a Ray token): for an Authorization header only, never for a log."""
        found = unless_missing(lambda: self.core_v1_client.read_namespaced_secret(name, namespace), None)
        return None if found is None else _secret_value(found.data, key)

    def pod_log_tail(self, pod: str, namespace: str, lines: int, container: str | None = None) -> list[str]:
        """The last `lines` log lines; an explanation line when the container has none yet."""
        if lines <= 0:
            return []
        try:
            return _log_lines(
                self.core_v1_client.read_namespaced_pod_log(pod, namespace, **_log_kwargs(lines, container))
            )
        except ApiException as exc:
            return _no_log(exc)


class GKEKubeObjectsHook(KubeObjectsHook, GKEKubernetesHook, gke_variant_of=KubeObjectsHook):
    """KubeObjectsHook authenticated to a GKE cluster endpoint by the google provider's GKEKubernetesHook.

    :param cluster_url: the cluster's endpoint (``resolve_gke_target``).
    :param ssl_ca_cert: its CA certificate (base64).
    :param gcp_conn_id: the Google Cloud connection.
    :param impersonation_chain: service account(s) to impersonate.
    :param use_dns_endpoint: reach the cluster through its DNS endpoint.
    """

    def get_namespace(self) -> str | None:
        return None  # no kubernetes connection: "default" unless the operator names one

    @property
    def is_in_cluster(self) -> bool:
        return False


class AsyncKubeObjectsHook(TargetedHook, AsyncKubernetesHook):
    """The reads the triggers poll with, and the trigger's kill-time delete, on kubernetes_asyncio.

    Each call opens the provider's ``get_conn()`` client and retries transient errors with the
    provider's ``generic_api_retry``.

    :param conn_id: the ``kubernetes`` connection (see the cncf-kubernetes provider's AsyncKubernetesHook).
    """

    group: ClassVar[str] = ""
    version: ClassVar[str] = ""

    @generic_api_retry
    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        async with self.get_conn() as api:
            read = async_client.CustomObjectsApi(api).get_namespaced_custom_object(
                self.group, self.version, namespace, plural, name
            )
            return as_dict(await await_unless_missing(read, None))

    @generic_api_retry
    async def objects(self, plural: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """``KubeObjectsHook.objects`` from an event loop."""
        async with self.get_conn() as api:
            found = await async_client.CustomObjectsApi(api).list_namespaced_custom_object(
                self.group, self.version, namespace, plural, label_selector=label_selector
            )
            return _items(found)

    @generic_api_retry
    async def delete(self, plural: str, name: str, namespace: str, *, foreground: bool = True) -> bool:
        """Request deletion (foreground propagation: gone once its pods are; background: gone at once); False
        when it was already gone."""
        policy = FOREGROUND_DELETE if foreground else BACKGROUND_DELETE
        async with self.get_conn() as api:
            request = async_client.CustomObjectsApi(api).delete_namespaced_custom_object(
                self.group, self.version, namespace, plural, name, **policy
            )
            return await await_unless_missing(request, DELETED) is not DELETED

    @generic_api_retry
    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        async with self.get_conn() as api:
            found = await async_client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=label_selector)
            return _items(api.sanitize_for_serialization(found))

    @generic_api_retry
    async def events_for(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
        async with self.get_conn() as api:
            found = await async_client.CoreV1Api(api).list_namespaced_event(namespace)
            return _involving(_items(api.sanitize_for_serialization(found)), names)

    @generic_api_retry
    async def secret_value(self, name: str, namespace: str, key: str) -> str | None:
        """``KubeObjectsHook.secret_value`` from an event loop."""
        async with self.get_conn() as api:
            reading = async_client.CoreV1Api(api).read_namespaced_secret(name, namespace)
            found = await await_unless_missing(reading, None)
            return None if found is None else _secret_value(found.data, key)

    async def pod_log_tail(self, pod: str, namespace: str, lines: int, container: str | None = None) -> list[str]:
        if lines <= 0:
            return []
        async with self.get_conn() as api:
            reading = async_client.CoreV1Api(api).read_namespaced_pod_log(
                pod, namespace, **_log_kwargs(lines, container)
            )
            try:
                return _log_lines(await reading)
            except async_client.ApiException as exc:
                return _no_log(exc)


class GKEAsyncKubeObjectsHook(AsyncKubeObjectsHook, GKEKubernetesAsyncHook, gke_variant_of=AsyncKubeObjectsHook):
    """AsyncKubeObjectsHook authenticated to a GKE endpoint by the google provider's GKEKubernetesAsyncHook.

    :param cluster_url: the cluster's endpoint.
    :param ssl_ca_cert: its CA certificate (base64).
    :param gcp_conn_id: the Google Cloud connection.
    :param impersonation_chain: service account(s) to impersonate.
    :param use_dns_endpoint: reach the cluster through its DNS endpoint.
    """
