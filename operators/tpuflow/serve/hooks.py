"""Ray Serve applications on a cluster's dashboard: Ray's ServeSubmissionClient in the worker, REST
from the triggerer.

The sync side is Ray's own ``ray.dashboard.modules.serve.sdk.ServeSubmissionClient`` (what
``serve deploy`` / ``serve status`` use). It sends the headers it is given on every request,
and adds Ray's own token header only when none is given, so our bearer token (the local
cluster's token file, or the ``ray`` connection's password) authenticates it. Ray's client is
synchronous (requests) and the triggerer cannot block its event loop, so the async side speaks
the same documented REST path (``/api/serve/applications/``) with aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuflow.ray.connection import RayDashboardHook

if TYPE_CHECKING:
    from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

APPLICATIONS_PATH = "/api/serve/applications/"


class RayServeHook(RayDashboardHook["ServeSubmissionClient"]):
    """Deploys, reads and deletes the Serve applications of one Ray cluster (connection type ``ray``).

    :param ray_conn_id: Airflow connection naming the dashboard (extra ``serve_url``: where the
        applications answer), when ``cluster`` does not.
    :param cluster: the cluster-start task's connection info (``dashboard_url``, ``serve_url``,
        ``auth_token_path``).
    """

    # --- sync (worker): Ray's ServeSubmissionClient -----------------------------------
    def create_client(self) -> ServeSubmissionClient:
        """Ray's Serve client (its constructor checks the dashboard answers and runs Ray >= 1.12)."""
        from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

        return ServeSubmissionClient(self.dashboard_url, headers=self.headers())

    def deploy_applications(self, config: dict[str, Any]) -> None:
        """PUT the whole Serve config (ServeDeploySchema): what KubeRay's RayService controller does."""
        self.get_client().deploy_applications(config)

    def get_serve_details(self) -> dict[str, Any]:
        """Serve's status: ``{"applications": {name: {"status", "message", "deployments"}}, ...}``."""
        return self.get_client().get_serve_details()

    def delete_applications(self) -> None:
        """Delete every application on the cluster (Serve's REST API has no per-app delete)."""
        self.get_client().delete_applications()

    # --- async (triggerer, and the worker's one wait): the same REST path ----------------
    async def aget_serve_details(self) -> dict[str, Any]:
        return await self.arequest("GET", APPLICATIONS_PATH) or {}

    async def adelete_applications(self) -> None:
        await self.arequest("DELETE", APPLICATIONS_PATH, timeout=60)
