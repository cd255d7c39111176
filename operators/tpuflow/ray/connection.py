"""Where a Ray cluster's dashboard is and how to authenticate to it: shared by every Ray hook.

A cluster is named either by ``cluster`` (the connection info a cluster-start task pushed to
XCom: ``dashboard_url``, ``serve_url`` and, for the local backend, ``auth_token_path``; for a
token-authenticated KubeRay cluster, ``ray_auth``: the Secret holding its token and the Kubernetes
target to read it through) or by an Airflow connection of type ``ray`` (``ray_conn_id``: host =
dashboard URL, port, password = Ray auth token if any, extra ``serve_url``). The token is read when
needed, sent only as the bearer header, and never logged or returned in XCom.

The product hooks (``RayJobHook`` for jobs, ``RayServeHook`` for Serve) use Ray's own
synchronous clients in the worker. Ray's clients block (requests), and the triggerer must not
block its event loop, so their async methods speak the same documented dashboard REST paths
with aiohttp, through the one request helper here. A wait opens the hook (``async with hook:``)
for its whole length: its calls then share one HTTP session (kept-alive connections, the token
read once) instead of paying a new session, connection and token read per request.
"""

from __future__ import annotations

import abc
import json
import os
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from airflow.sdk import BaseHook

from tpuflow.errors import UserInputError

if TYPE_CHECKING:
    import aiohttp

ClientT = TypeVar("ClientT")

# Ray's JobSubmissionClient lets RAY_API_SERVER_ADDRESS / RAY_ADDRESS override the address it is given
# (ray.dashboard.utils.get_address_for_submission_client), so a worker whose environment names another
# cluster (`eval "$(tpuflow local env)"` in the shell that starts Airflow) would send the run's jobs there.
# The hook's cluster is the run's: the variables are hidden while a client resolves its address.
_ADDRESS_OVERRIDES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_ADDRESS_LOCK = threading.Lock()


@contextmanager
def _address_as_given() -> Iterator[None]:
    with _ADDRESS_LOCK:
        hidden = {k: os.environ.pop(k) for k in _ADDRESS_OVERRIDES if k in os.environ}
        try:
            yield
        finally:
            os.environ.update(hidden)


class RayDashboardHook(BaseHook, Generic[ClientT], abc.ABC):
    """Addressing and authentication of one Ray cluster's dashboard (port 8265 on KubeRay), and the
    product's Ray client (``create_client``), made once per hook.

    :param ray_conn_id: Airflow connection (type ``ray``) naming the dashboard, when ``cluster``
        does not.
    :param cluster: the cluster-start task's connection info (``dashboard_url``, ``serve_url``,
        ``auth_token_path`` or ``ray_auth``).
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray cluster (dashboard)"

    def __init__(self, ray_conn_id: str | None = None, cluster: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.ray_conn_id = ray_conn_id
        self.cluster = dict(cluster or {})
        self._client: ClientT | None = None
        self._session: aiohttp.ClientSession | None = None
        self._opened = 0
        self._token: str | None = None

    @abc.abstractmethod
    def create_client(self) -> ClientT:
        """The product's synchronous Ray client for ``dashboard_url`` with ``headers()``."""
        ...

    def get_client(self) -> ClientT:
        if self._client is None:
            with _address_as_given():
                self._client = self.create_client()
        return self._client

    @property
    def dashboard_url(self) -> str:
        if self.cluster.get("dashboard_url"):
            return str(self.cluster["dashboard_url"]).rstrip("/")
        if not self.ray_conn_id:
            raise UserInputError(
                "cluster", self.cluster, "pass the cluster info from the start task's XCom or a ray_conn_id"
            )
        conn = self.get_connection(self.ray_conn_id)
        host = conn.host or ""
        if not host.startswith(("http://", "https://")):
            host = f"http://{host}"
        return f"{host}:{conn.port}" if conn.port else host

    @property
    def serve_url(self) -> str:
        if self.cluster.get("serve_url"):
            return str(self.cluster["serve_url"]).rstrip("/")
        conn = self.get_connection(self.ray_conn_id) if self.ray_conn_id else None
        url = (conn.extra_dejson.get("serve_url") if conn else None) or ""
        if not url:
            raise UserInputError("cluster", self.cluster, "the cluster info has no serve_url")
        return url.rstrip("/")

    @property
    def metrics_url(self) -> str:
        """The head's Prometheus endpoint (Ray's metrics exporter): the cluster info's ``metrics_url``, or the
        connection's extra ``metrics_url``."""
        if self.cluster.get("metrics_url"):
            return str(self.cluster["metrics_url"])
        conn = self.get_connection(self.ray_conn_id) if self.ray_conn_id else None
        url = (conn.extra_dejson.get("metrics_url") if conn else None) or ""
        if not url:
            raise UserInputError(
                "cluster",
                {k: v for k, v in self.cluster.items() if k.endswith("_url")},
                "the cluster info has no metrics_url (the head's Prometheus port, 8080 on KubeRay): expose it, or "
                "set the ray connection's extra metrics_url",
            )
        return url

    def headers(self) -> dict[str, str]:
        """The bearer token of a token-authenticated cluster (RAY_AUTH_MODE=token), else none.

        Ray's clients add their own Authorization header only when none is given, so this one wins.
        """
        if self._token is None:
            ref = self._secret_reference()
            if ref is not None:
                from tpuflow.kubernetes.hooks import KubeObjectsHook, KubeTarget

                hook = KubeObjectsHook.for_target(KubeTarget.from_dict(ref["kube_target"]))
                self._token = self._require_token(hook.secret_value(ref["secret_name"], ref["namespace"], ref["key"]))
            else:
                self._token = self._local_token() or ""
        return _bearer(self._token)

    async def aheaders(self) -> dict[str, str]:
        """``headers()`` from an event loop: the Secret is read with the async Kubernetes client."""
        if self._token is None:
            ref = self._secret_reference()
            if ref is not None:
                from tpuflow.kubernetes.hooks import AsyncKubeObjectsHook, KubeTarget

                hook = AsyncKubeObjectsHook.for_target(KubeTarget.from_dict(ref["kube_target"]))
                value = await hook.secret_value(ref["secret_name"], ref["namespace"], ref["key"])
                self._token = self._require_token(value)
            else:
                self._token = self._local_token() or ""
        return _bearer(self._token)

    def _secret_reference(self) -> dict[str, Any] | None:
        ref = self.cluster.get("ray_auth")
        if not ref:
            return None
        if not isinstance(ref, dict) or not all(ref.get(k) for k in ("secret_name", "namespace", "key")):
            raise UserInputError(
                "cluster['ray_auth']", ref, "pass the cluster-start task's XCom unchanged (secret_name, namespace, key)"
            )
        return {**ref, "kube_target": dict(ref.get("kube_target") or {})}

    def _require_token(self, value: str | None) -> str:
        if not value:
            ref = self.cluster["ray_auth"]
            raise RuntimeError(
                f"Ray token Secret {ref['namespace']}/{ref['secret_name']} (key {ref['key']}) is missing or empty; "
                "KubeRay creates it with the RayCluster (authOptions mode token)"
            )
        return value

    def _local_token(self) -> str | None:
        token_path = self.cluster.get("auth_token_path")
        if token_path and Path(token_path).exists():
            return Path(token_path).read_text().strip()
        if self.ray_conn_id:
            return self.get_connection(self.ray_conn_id).password
        return None

    async def __aenter__(self) -> Self:
        """Open the hook for a wait: its async calls share one HTTP session until the wait ends."""
        self._opened += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._opened -= 1
        if self._opened == 0:
            await self.aclose()

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @asynccontextmanager
    async def asession(self) -> AsyncIterator[aiohttp.ClientSession]:
        """The hook's HTTP session while it is open (``async with hook``), else one for this call."""
        import aiohttp

        if self._opened:
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession(headers=await self.aheaders())
            yield self._session
            return
        async with aiohttp.ClientSession(headers=await self.aheaders()) as session:
            yield session

    async def arequest(self, method: str, path: str, *, body: Any = None, timeout: float = 30.0) -> Any:
        """One dashboard REST call from an event loop: the decoded JSON answer (None when empty), or
        None for 404 (the job or app is not there). Other error statuses raise
        ``aiohttp.ClientResponseError``."""
        import aiohttp

        async with self.asession() as session:
            async with session.request(
                method, f"{self.dashboard_url}{path}", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status == 404:
                    return None
                resp.raise_for_status()
                text = await resp.text()
                return json.loads(text) if text.strip() else None


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_cluster(cluster: Any, ray_conn_id: str | None) -> None:
    """The one check of an operator's ``cluster`` argument (once rendered): the start task's XCom."""
    if cluster in (None, "") and not ray_conn_id:
        raise UserInputError(
            "cluster",
            cluster,
            "pass the cluster-start task's XCom (its connection info) or a ray_conn_id naming a Ray connection",
        )
    if cluster not in (None, "") and not isinstance(cluster, dict):
        raise UserInputError(
            "cluster",
            cluster,
            "pass the cluster-start task's XCom (a dict), e.g. "
            "\"{{ ti.xcom_pull(task_ids='start_cluster') }}\" with render_template_as_native_obj",
        )
