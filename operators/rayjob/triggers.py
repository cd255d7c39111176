"""Deferrable wait for a Ray job, streaming its driver log into the Airflow task log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from operators.rayjob.hooks import TERMINAL_JOB_STATES, RayJobHook, log_tail, parse_result, strip_ansi


class RayJobTrigger(BaseTrigger):
    """Polls a Ray job until it is SUCCEEDED, FAILED or STOPPED.

    New driver log lines are written to the task log as they appear (Airflow routes trigger
    logs to the task's log), so a long training job shows progress while it runs.
    """

    def __init__(
        self,
        submission_id: str,
        cluster: dict[str, Any] | None = None,
        ray_conn_id: str | None = None,
        poll_interval: float = 2.0,
        timeout: float | None = None,
        log_offset: int = 0,
        started_at: float | None = None,
    ) -> None:
        super().__init__()
        self.submission_id = submission_id
        self.cluster = cluster or {}
        self.ray_conn_id = ray_conn_id
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.log_offset = log_offset
        self.started_at = started_at if started_at is not None else time.time()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "submission_id": self.submission_id,
                "cluster": self.cluster,
                "ray_conn_id": self.ray_conn_id,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "log_offset": self.log_offset,
                "started_at": self.started_at,
            },
        )

    def _hook(self) -> RayJobHook:
        return RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        offset = self.log_offset
        logs = ""
        while True:
            try:
                info = await hook.aget_job_info(self.submission_id)
                logs = await hook.aget_job_logs(self.submission_id)
            except Exception as err:  # the dashboard can be briefly unreachable; the deadline bounds this
                self.log.warning("Ray dashboard unreachable (%s); retrying", err)
                info = {"status": "UNKNOWN"}
            if len(logs) > offset:
                for line in strip_ansi(logs[offset:]).rstrip("\n").splitlines():
                    self.log.info("[ray job] %s", line)
                offset = len(logs)
            if info is None:
                yield TriggerEvent(self._event("FAILED", f"Ray job {self.submission_id} no longer exists", logs))
                return
            status = str(info.get("status", "UNKNOWN"))
            if status in TERMINAL_JOB_STATES:
                yield TriggerEvent(self._event(status, info.get("message") or "", logs))
                return
            if self.timeout is not None and time.time() - self.started_at > self.timeout:
                await hook.astop_job(self.submission_id)
                yield TriggerEvent(self._event("TIMEOUT", f"job exceeded {self.timeout:.0f}s and was stopped", logs))
                return
            await asyncio.sleep(self.poll_interval)

    def _event(self, status: str, message: str, logs: str) -> dict[str, Any]:
        return {
            "status": status,
            "submission_id": self.submission_id,
            "message": message,
            "log_tail": log_tail(logs),
            "result": parse_result(logs),
        }

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: stop the job it runs."""
        self.log.info("Stopping Ray job %s because the task was killed", self.submission_id)
        await self._hook().astop_job(self.submission_id)
