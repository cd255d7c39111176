"""Access to a Ray cluster's dashboard: job submission (Ray's JobSubmissionClient) and Serve's REST API.

The sync side uses Ray's own JobSubmissionClient. The triggerer cannot block its event
loop, and Ray's client is synchronous (requests), so the async side speaks the same
documented dashboard REST paths (/api/jobs/, /api/serve/applications/) with aiohttp.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from tpuflow.errors import UserInputError

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

TERMINAL_JOB_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
RESULT_MARKER = "TPUFLOW_RESULT "


class RayJobHook(BaseHook):
    """Talks to one Ray cluster's dashboard (port 8265 on KubeRay, a loopback port locally).

    The cluster is named either by `cluster` (the connection info a cluster-start task pushed
    to XCom: dashboard_url and, for the local backend, auth_token_path) or by an Airflow
    connection (`ray_conn_id`: host = dashboard URL, password = Ray auth token if any).
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray cluster (dashboard)"

    def __init__(self, ray_conn_id: str | None = None, cluster: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.ray_conn_id = ray_conn_id
        self.cluster = cluster or {}
        self._client: JobSubmissionClient | None = None

    # --- addressing ------------------------------------------------------------
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

    def headers(self) -> dict[str, str]:
        token = None
        token_path = self.cluster.get("auth_token_path")
        if token_path and Path(token_path).exists():
            token = Path(token_path).read_text().strip()
        elif self.ray_conn_id:
            token = self.get_connection(self.ray_conn_id).password
        return {"Authorization": f"Bearer {token}"} if token else {}

    # --- jobs (sync: operators) ---------------------------------------------------
    def get_client(self) -> JobSubmissionClient:
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.dashboard_url, headers=self.headers())
        return self._client

    def find_jobs(self, submission_id_prefix: str) -> list[Any]:
        """Jobs whose submission id is the prefix or a numbered resubmission of it, oldest first."""
        pattern = re.compile(rf"^{re.escape(submission_id_prefix)}(-r\d+)?$")
        jobs = [j for j in self.get_client().list_jobs() if j.submission_id and pattern.match(j.submission_id)]
        return sorted(jobs, key=lambda j: (j.start_time or 0, j.submission_id))

    def submit_job(
        self,
        entrypoint: str,
        submission_id: str,
        runtime_env: dict[str, Any] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> str:
        return self.get_client().submit_job(
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env=runtime_env,
            entrypoint_num_cpus=entrypoint_num_cpus,
            entrypoint_resources=entrypoint_resources,
            metadata=metadata,
        )

    def get_job_status(self, submission_id: str) -> str:
        return str(self.get_client().get_job_status(submission_id).value)

    def get_job_logs(self, submission_id: str) -> str:
        return self.get_client().get_job_logs(submission_id)

    def stop_job(self, submission_id: str) -> bool:
        return bool(self.get_client().stop_job(submission_id))

    # --- jobs and Serve (async: triggers) -------------------------------------------
    async def _aget(self, path: str) -> Any:
        import aiohttp

        async with aiohttp.ClientSession(headers=self.headers()) as session:
            async with session.get(f"{self.dashboard_url}{path}", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                if resp.status == 404:
                    return None
                resp.raise_for_status()
                return await resp.json(content_type=None)

    async def aget_job_info(self, submission_id: str) -> dict[str, Any] | None:
        return await self._aget(f"/api/jobs/{submission_id}")

    async def aget_job_logs(self, submission_id: str) -> str:
        data = await self._aget(f"/api/jobs/{submission_id}/logs")
        return (data or {}).get("logs", "")

    async def _asend(self, method: str, path: str, timeout: float = 30.0) -> None:
        """A request whose answer is only its status; 404 (already gone) counts as done."""
        import aiohttp

        async with aiohttp.ClientSession(headers=self.headers()) as session:
            url = f"{self.dashboard_url}{path}"
            async with session.request(method, url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status not in (200, 404):
                    resp.raise_for_status()

    async def astop_job(self, submission_id: str) -> None:
        await self._asend("POST", f"/api/jobs/{submission_id}/stop")

    async def adelete_serve_applications(self) -> None:
        await self._asend("DELETE", "/api/serve/applications/", timeout=60)

    async def aget_serve_applications(self) -> dict[str, Any]:
        return await self._aget("/api/serve/applications/") or {}

    # --- Serve (sync) --------------------------------------------------------------
    def put_serve_config(self, config: dict[str, Any]) -> None:
        import requests

        resp = requests.put(
            f"{self.dashboard_url}/api/serve/applications/", json=config, headers=self.headers(), timeout=60
        )
        if not resp.ok:
            raise RuntimeError(f"Ray Serve rejected the config ({resp.status_code}): {resp.text[:2000]}")

    def get_serve_applications(self) -> dict[str, Any]:
        import requests

        resp = requests.get(f"{self.dashboard_url}/api/serve/applications/", headers=self.headers(), timeout=30)
        resp.raise_for_status()
        return resp.json()

    def delete_serve_applications(self) -> None:
        import requests

        resp = requests.delete(f"{self.dashboard_url}/api/serve/applications/", headers=self.headers(), timeout=60)
        if resp.status_code not in (200, 404):
            resp.raise_for_status()


def parse_result(logs: str) -> dict[str, Any]:
    """The last `TPUFLOW_RESULT {json}` line a job printed (its result for XCom), or {}."""
    import json

    for line in reversed(logs.splitlines()):
        idx = line.find(RESULT_MARKER)
        if idx >= 0:
            try:
                value = json.loads(line[idx + len(RESULT_MARKER) :])
            except ValueError:
                continue
            return value if isinstance(value, dict) else {"result": value}
    return {}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """Ray colours its log prefixes; task logs and error messages read better without escapes."""
    return _ANSI.sub("", text)


def log_tail(logs: str, lines: int = 40) -> str:
    return strip_ansi("\n".join(logs.rstrip().splitlines()[-lines:]))
