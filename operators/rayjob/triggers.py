"""Deferrable wait for a Ray job, streaming its driver log into the Airflow task log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from tpuflow.rayjob.hooks import TERMINAL_JOB_STATES, RayJobHook, log_tail, parse_result, strip_ansi

# XCom of the deferred task holding how far its log has streamed the job's driver log.
LOG_CURSOR_XCOM_KEY = "ray_job_log_cursor"


class RayJobTrigger(BaseTrigger):
    """Polls a Ray job until it is SUCCEEDED, FAILED or STOPPED.

    New driver log lines are written to the task log as they appear (Airflow routes trigger
    logs to the task's log), so a long training job shows progress while it runs.

    A restarted triggerer re-creates the trigger from its serialized kwargs, which still hold
    the offset the wait began at; streaming from there again would repeat every line already
    in the task log. So the offset reached is also kept in an XCom of the task: XCom is the
    store a trigger can write in Airflow 3.3 (the task state store is not reachable from the
    triggerer), and Airflow keeps a task's XComs across deferral resumes, clearing them only
    when a new try starts (whose log file is new too). Lines are logged before the offset is
    saved, so a crash in between repeats at most one poll's lines and never loses any.
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
        restart_if_stopped: bool = False,
    ) -> None:
        super().__init__()
        self.submission_id = submission_id
        self.cluster = cluster or {}
        self.ray_conn_id = ray_conn_id
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.log_offset = log_offset
        self.started_at = started_at if started_at is not None else time.time()
        self.restart_if_stopped = restart_if_stopped  # echoed in the event for execute_complete
        self._cursor_broken = False

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
                "restart_if_stopped": self.restart_if_stopped,
            },
        )

    def _hook(self) -> RayJobHook:
        return RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        offset = max(self.log_offset, await self._saved_offset())
        if offset > self.log_offset:
            self.log.info("Resuming the driver log of %s at character %d (streamed before a restart)",
                          self.submission_id, offset)
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
                await self._save_offset(offset)
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

    def _xcom_address(self) -> dict[str, Any] | None:
        ti = self.task_instance  # set by the triggerer; None when the trigger runs on its own
        if ti is None or self._cursor_broken:
            return None
        return {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": ti.map_index}

    async def _saved_offset(self) -> int:
        where = self._xcom_address()
        if where is None:
            return 0
        try:
            from airflow.sdk.execution_time.xcom import XCom

            saved = await XCom.aget_one(key=LOG_CURSOR_XCOM_KEY, **where)
        except Exception as err:  # no API to ask (a trigger run in-process by tests or dag.test)
            self.log.debug("No saved log cursor (%s)", err)
            return 0
        if isinstance(saved, dict) and saved.get("submission_id") == self.submission_id:
            return int(saved.get("offset") or 0)
        return 0

    async def _save_offset(self, offset: int) -> None:
        where = self._xcom_address()
        if where is None:
            return
        try:
            from airflow.sdk.execution_time.xcom import XCom

            await XCom.aset(LOG_CURSOR_XCOM_KEY, {"submission_id": self.submission_id, "offset": offset}, **where)
        except Exception as err:  # streaming matters more than the cursor; a restart may then repeat lines
            self.log.warning("Could not save the log cursor of %s: %s", self.submission_id, err)
            self._cursor_broken = True  # stop trying for this wait

    def _event(self, status: str, message: str, logs: str) -> dict[str, Any]:
        return {
            "status": status,
            "submission_id": self.submission_id,
            "message": message,
            "log_tail": log_tail(logs),
            "result": parse_result(logs),
            "restart_if_stopped": self.restart_if_stopped,
        }

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: stop the job it runs."""
        self.log.info("Stopping Ray job %s because the task was killed", self.submission_id)
        await self._hook().astop_job(self.submission_id)
