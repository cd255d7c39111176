"""Ray jobs on a cluster's dashboard: Ray's JobSubmissionClient in the worker, REST from the triggerer.

The sync side is Ray's own ``ray.job_submission.JobSubmissionClient``. Ray's client is synchronous
(requests) and the triggerer cannot block its event loop, so the async side speaks the same
documented job REST paths (``/api/jobs/...``) with aiohttp (``RayDashboardHook.arequest``), and
follows a driver log through the dashboard's log tail websocket (``/api/jobs/{id}/logs/tail``, what
``JobSubmissionClient.tail_job_logs`` uses), which sends each part of the log once, instead of the
whole log per request. Addressing and authentication live in ``tpuflow.ray.connection``.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from tpuflow.ray.connection import RayDashboardHook

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

TERMINAL_JOB_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
RESULT_MARKER = "TPUFLOW_RESULT "
# The job metadata key holding the job's result nonce. Ray hands a job's metadata to its driver alone (in the
# driver's job config); tpuflow_driver.result.emit_result prints it on the result line (its NONCE_KEY).
RESULT_NONCE_KEY = "tpuflow_result_nonce"
# Log tails one process keeps open to one dashboard. Ray's dashboard relays each tail to the
# driver node's agent through one aiohttp session (100 connections) that job submit and stop
# share too, so a triggerer holding many waits must not take them all; waits past this poll.
MAX_LOG_TAILS_PER_DASHBOARD = 32
_open_tails: dict[str, int] = {}


class LogTailBusy(Exception):
    """This process already has MAX_LOG_TAILS_PER_DASHBOARD log tails open to the dashboard."""


class RayJobHook(RayDashboardHook["JobSubmissionClient"]):
    """Submits, finds, follows and stops Ray jobs on one cluster (the ``ray`` connection type's hook).

    :param ray_conn_id: Airflow connection naming the dashboard, when ``cluster`` does not.
    :param cluster: the cluster-start task's connection info (``dashboard_url``, ``auth_token_path``).
    """

    # --- sync (worker): Ray's JobSubmissionClient ------------------------------------
    def create_client(self) -> JobSubmissionClient:
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.dashboard_url, headers=self.headers())

    def find_jobs(self, submission_id_prefix: str) -> list[JobDetails]:
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

    # --- async (triggerer, and the worker's one wait): the same REST paths -------------
    async def aget_job_info(self, submission_id: str) -> dict[str, Any] | None:
        """The job's details (``status``, ``message``, ...), or None when there is no such job."""
        # the dashboard's decoded JSON answer (a job's details object), or None for 404
        return cast("dict[str, Any] | None", await self.arequest("GET", f"/api/jobs/{submission_id}"))

    async def aget_job_logs(self, submission_id: str) -> str:
        return str((await self.arequest("GET", f"/api/jobs/{submission_id}/logs") or {}).get("logs", ""))

    async def atail_job_logs(self, submission_id: str) -> AsyncIterator[str]:
        """The driver log from its first character, chunk by chunk as Ray reads it from the log file
        (about once a second); ends when the job ended and the whole log was sent. Raises on a
        refused handshake (e.g. no such job: 404) or a connection that broke off, and
        ``LogTailBusy`` when this process has its share of tails to this dashboard open."""
        url = self.dashboard_url
        if _open_tails.get(url, 0) >= MAX_LOG_TAILS_PER_DASHBOARD:
            raise LogTailBusy(url)
        _open_tails[url] = _open_tails.get(url, 0) + 1
        try:
            async for chunk in self._tail(url, submission_id):
                yield chunk
        finally:
            _open_tails[url] -= 1

    async def _tail(self, url: str, submission_id: str) -> AsyncIterator[str]:
        import aiohttp

        async with self.asession() as session:
            # max_msg_size=0: one very long line is one message, whatever its length.
            async with session.ws_connect(
                f"{url}/api/jobs/{submission_id}/logs/tail", max_msg_size=0, autoping=True
            ) as ws:
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        yield msg.data
                    elif msg.type == aiohttp.WSMsgType.ERROR:
                        raise ConnectionError(f"the log tail of {submission_id} broke off: {ws.exception()!r}")
                if ws.close_code not in (None, aiohttp.WSCloseCode.OK):
                    raise ConnectionError(f"the log tail of {submission_id} closed with code {ws.close_code}")

    async def astop_job(self, submission_id: str) -> None:
        await self.arequest("POST", f"/api/jobs/{submission_id}/stop")


def new_result_nonce() -> str:
    """A fresh nonce for one job's result line (128 random bits, no spaces)."""
    return secrets.token_hex(16)


def job_result_nonce(job: Any) -> str | None:
    """The result nonce a job was submitted with (its metadata), or None for a job submitted without one."""
    metadata = getattr(job, "metadata", None)
    nonce = metadata.get(RESULT_NONCE_KEY) if isinstance(metadata, dict) else None
    return nonce if isinstance(nonce, str) and nonce else None


def parse_result(logs: str, nonce: str | None = None) -> dict[str, Any]:
    """The last ``TPUFLOW_RESULT <nonce> {json}`` line a job printed (its result for XCom), or {}.

    With ``nonce`` (every job tpuflow submits) only a line carrying it counts: the driver knows it, the job's
    workers, whose output Ray forwards into the same log, do not. Without (a job an earlier version submitted,
    re-attached to), the last ``TPUFLOW_RESULT {json}`` line."""
    head = f"{RESULT_MARKER}{nonce} " if nonce else RESULT_MARKER
    for line in reversed(logs.splitlines()):
        idx = line.find(head)
        if idx >= 0:
            try:
                value = json.loads(line[idx + len(head) :])
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
