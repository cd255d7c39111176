"""KubeRay custom objects, pods, logs, services and events through the providers' Kubernetes hooks.

Two ways to reach the Kubernetes API, both serialisable for triggers (KubeTarget.to_dict()):

- a ``kubernetes`` connection (cncf-kubernetes KubernetesHook / AsyncKubernetesHook): extras
  ``kube_config_path`` | ``kube_config`` | ``in_cluster``, ``cluster_context``, ``namespace``,
  ``disable_verify_ssl``; e.g. for the local stand-in
  ``AIRFLOW_CONN_KUBE_STANDIN='{"conn_type": "kubernetes", "extra": {"kube_config_path": "/tmp/kc"}}'``.
- a GKE cluster (google provider GKEKubernetesHook / GKEKubernetesAsyncHook): the operator resolves
  the endpoint and CA certificate from ``gke_cluster={"project_id", "location", "cluster_name"}``.

Heavy imports (kubernetes, providers) happen here, never in the operators module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from kubernetes import client as k8s
from tpuflow.kuberay import GROUP, VERSION


class KubeApiError(Exception):
    """A Kubernetes API error with the Status object's code, reason and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"Kubernetes API {code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message

    @classmethod
    def from_exception(cls, exc: Any) -> KubeApiError:
        code = int(getattr(exc, "status", 0) or 0)
        body: Any = getattr(exc, "body", None)
        reason, message = str(getattr(exc, "reason", "") or ""), str(body or exc)
        try:
            data = json.loads(body) if isinstance(body, (str, bytes)) else None
        except ValueError:
            data = None
        if isinstance(data, Mapping):
            reason = str(data.get("reason") or reason)
            message = str(data.get("message") or message)
        return cls(code, reason, message)


class _HttpError(Exception):
    def __init__(self, status: int, body: bytes | str) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.reason = status, ""
        self.body = body.decode(errors="replace") if isinstance(body, bytes) else body


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


def resolve_gke_target(gke_cluster: Mapping[str, Any], gcp_conn_id: str,
                       impersonation_chain: str | Sequence[str] | None) -> KubeTarget:
    """Endpoint and CA certificate of a GKE cluster, as the google provider's GKE operators fetch them."""
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook
    from airflow.providers.google.cloud.operators.kubernetes_engine import GKEClusterAuthDetails

    chain = tuple(impersonation_chain) if isinstance(impersonation_chain, (list, tuple)) else impersonation_chain
    cluster_hook = GKEHook(gcp_conn_id=gcp_conn_id, location=gke_cluster["location"], impersonation_chain=chain)
    use_dns = bool(gke_cluster.get("use_dns_endpoint", False))
    url, ca = GKEClusterAuthDetails(
        cluster_name=gke_cluster["cluster_name"], project_id=gke_cluster["project_id"],
        use_internal_ip=bool(gke_cluster.get("use_internal_ip", False)), use_dns_endpoint=use_dns,
        cluster_hook=cluster_hook,
    ).fetch_cluster_info()
    return KubeTarget(kubernetes_conn_id=None, cluster_url=url, ssl_ca_cert=ca, gcp_conn_id=gcp_conn_id,
                      impersonation_chain=chain, use_dns_endpoint=use_dns)


class KubeRayHook:
    """Synchronous calls the operators make (create/adopt/update/delete, diagnostics)."""

    def __init__(self, target: KubeTarget) -> None:
        self.target = target

    @cached_property
    def kube(self) -> Any:
        if self.target.gke:
            from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesHook

            return GKEKubernetesHook(
                cluster_url=self.target.cluster_url, ssl_ca_cert=self.target.ssl_ca_cert,
                gcp_conn_id=self.target.gcp_conn_id, impersonation_chain=self.target.impersonation_chain,
                use_dns_endpoint=self.target.use_dns_endpoint,
            )
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=self.target.kubernetes_conn_id)

    @cached_property
    def api_client(self) -> k8s.ApiClient:
        return self.kube.api_client

    @cached_property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api_client)

    @cached_property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api_client)

    def default_namespace(self) -> str:
        if self.target.gke:
            return "default"
        return str(self.kube.get_namespace() or "default")

    def is_in_cluster(self) -> bool:
        """True when the hook authenticates with the pod's service account (Airflow runs inside)."""
        if self.target.gke:
            return False
        return bool(self.kube.is_in_cluster)

    # --- custom objects ---
    def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name))
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeApiError.from_exception(exc) from exc

    def create(self, plural: str, body: Mapping[str, Any], namespace: str, *, dry_run: bool = False) -> dict[str, Any]:
        kwargs = {"dry_run": "All"} if dry_run else {}
        try:
            return dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, dict(body),
                                                                    **kwargs))
        except k8s.ApiException as exc:
            raise KubeApiError.from_exception(exc) from exc

    def patch(self, plural: str, name: str, patch: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        try:
            return dict(self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, dict(patch)))
        except k8s.ApiException as exc:
            raise KubeApiError.from_exception(exc) from exc

    def delete(self, plural: str, name: str, namespace: str) -> bool:
        """Request deletion (background propagation); False when it was already gone."""
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name,
                                                        propagation_policy="Background")
            return True
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise KubeApiError.from_exception(exc) from exc

    # --- core objects, raw JSON (camelCase, as kubectl shows them) ---
    def _raw(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            resp = call(*args, _preload_content=False, **kwargs)
        except k8s.ApiException as exc:
            raise KubeApiError.from_exception(exc) from exc
        if not 200 <= int(resp.status) < 300:  # unpreloaded responses are not status-checked by every client
            raise KubeApiError.from_exception(_HttpError(int(resp.status), resp.data))
        return resp.data

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return list(json.loads(self._raw(self.core.list_namespaced_pod, namespace,
                                         label_selector=label_selector)).get("items") or [])

    def list_events(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
        items = json.loads(self._raw(self.core.list_namespaced_event, namespace)).get("items") or []
        wanted = set(names)
        return [e for e in items if (e.get("involvedObject") or {}).get("name") in wanted]

    def get_service(self, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self._raw(self.core.read_namespaced_service, name, namespace)))
        except KubeApiError as err:
            if err.code == 404:
                return None
            raise

    def pod_log_tail(self, pod: str, namespace: str, lines: int, container: str | None = None) -> list[str]:
        """The last `lines` log lines; [] with an explanation line when the container has none yet."""
        if lines <= 0:
            return []
        kwargs: dict[str, Any] = {"tail_lines": lines}
        if container:
            kwargs["container"] = container
        try:
            data = self._raw(self.core.read_namespaced_pod_log, pod, namespace, **kwargs)
        except KubeApiError as err:
            return [f"(no log: {err.message})"]
        return (data.decode(errors="replace") if isinstance(data, bytes) else str(data)).splitlines()


class AsyncKubeRayHook:
    """The reads the triggers poll with, on kubernetes_asyncio through the providers' async hooks."""

    def __init__(self, target: KubeTarget) -> None:
        self.target = target

    @cached_property
    def kube(self) -> Any:
        if self.target.gke:
            from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook

            return GKEKubernetesAsyncHook(
                cluster_url=self.target.cluster_url or "", ssl_ca_cert=self.target.ssl_ca_cert or "",
                gcp_conn_id=self.target.gcp_conn_id, impersonation_chain=self.target.impersonation_chain,
                use_dns_endpoint=self.target.use_dns_endpoint,
            )
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        return AsyncKubernetesHook(conn_id=self.target.kubernetes_conn_id)

    async def _raw(self, api_name: str, method: str, *args: Any, **kwargs: Any) -> bytes:
        from kubernetes_asyncio import client as async_k8s

        async with self.kube.get_conn() as api_client:
            api = getattr(async_k8s, api_name)(api_client)
            try:
                resp = await getattr(api, method)(*args, _preload_content=False, **kwargs)
                data = bytes(await resp.read())
            except async_k8s.ApiException as exc:
                raise KubeApiError.from_exception(exc) from exc
            # kubernetes_asyncio does not check the status of an unpreloaded response: a 404 body is a Status.
            if not 200 <= int(resp.status) < 300:
                raise KubeApiError.from_exception(_HttpError(int(resp.status), data))
            return data

    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            raw = await self._raw("CustomObjectsApi", "get_namespaced_custom_object", GROUP, VERSION, namespace,
                                  plural, name)
        except KubeApiError as err:
            if err.code == 404:
                return None
            raise
        return dict(json.loads(raw))

    async def delete(self, plural: str, name: str, namespace: str) -> bool:
        """Request deletion (background propagation); False when it was already gone."""
        try:
            await self._raw("CustomObjectsApi", "delete_namespaced_custom_object", GROUP, VERSION, namespace,
                            plural, name, propagation_policy="Background")
        except KubeApiError as err:
            if err.code == 404:
                return False
            raise
        return True

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        raw = await self._raw("CoreV1Api", "list_namespaced_pod", namespace, label_selector=label_selector)
        return list(json.loads(raw).get("items") or [])

    async def list_events(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
        items = json.loads(await self._raw("CoreV1Api", "list_namespaced_event", namespace)).get("items") or []
        wanted = set(names)
        return [e for e in items if (e.get("involvedObject") or {}).get("name") in wanted]

    async def pod_log_tail(self, pod: str, namespace: str, lines: int, container: str | None = None) -> list[str]:
        if lines <= 0:
            return []
        kwargs: dict[str, Any] = {"tail_lines": lines}
        if container:
            kwargs["container"] = container
        try:
            data = await self._raw("CoreV1Api", "read_namespaced_pod_log", pod, namespace, **kwargs)
        except KubeApiError as err:
            return [f"(no log: {err.message})"]
        return data.decode(errors="replace").splitlines()
