"""Deferrable wait for a Ray job, streaming its driver log into the Airflow task log."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import TriggerEvent

from tpuflow.ray.connection import RayDashboardHook
from tpuflow.rayjob import UNREACHABLE_TIMEOUT_S
from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.rayjob.quality_gate import gate_failure
from tpuflow.rayjob.waits import wait_for_job
from tpuflow.triggers import TpuflowTrigger
from tpuflow.work_spans import WORK_SPAN_KEY, job_work_span

# XCom of the deferred task holding how far its log has streamed the job's driver log.
LOG_CURSOR_XCOM_KEY = "ray_job_log_cursor"


class RayJobTrigger(TpuflowTrigger):
    """Polls a Ray job until it is SUCCEEDED, FAILED or STOPPED (``tpuflow.rayjob.waits.wait_for_job``).

    New driver log lines are written to the task log as they appear (Airflow routes trigger
    logs to the task's log), so a long training job shows progress while it runs.

    A restarted triggerer re-creates the trigger from its serialized kwargs, which still hold
    the offset the wait began at; streaming from there again would repeat every line already
    in the task log. So the offset reached is also kept in an XCom of the task: XCom is the
    store a trigger can write in Airflow 3.3 (the task state store is not reachable from the
    triggerer), and Airflow keeps a task's XComs across deferral resumes, clearing them only
    when a new try starts (whose log file is new too). Lines are logged before the offset is
    saved, so a crash in between repeats at most one poll's lines and never loses any.

    Killing the deferred task (marking it failed/success, clearing it) stops the job
    (``on_kill``); ``cleanup()``, which also runs on triggerer restarts, does nothing destructive.

    :param submission_id: the Ray job to follow.
    :param cluster: the cluster-start task's connection info (dashboard_url, auth_token_path).
    :param ray_conn_id: Airflow connection naming the dashboard, when ``cluster`` does not.
    :param poll_interval: seconds between polls.
    :param timeout: seconds after ``started_at`` when the job is stopped and the wait ends; None: no limit.
    :param log_offset: driver-log characters already in the task log when the wait began.
    :param started_at: epoch seconds the wait (and its timeout) began; default now.
    :param restart_if_stopped: a STOPPED end is the earlier try's kill landing late: report it as
        ``success`` with ``job_status`` STOPPED so the task submits a fresh job.
    :param result_nonce: the job's result nonce (its metadata): only a result line carrying it is its result.
    :param unreachable_timeout: seconds the dashboard may not answer in a row before the wait fails (retryable).
    :param end_task: ``RaySubmitJobOperator.task_end()``: ``{"min_result", "return_result"}`` to end the
        task here when the job SUCCEEDED and its result passes the gate (the result is the task's return
        value when ``return_result``); None, or any other outcome: the task resumes on a worker.
    """

    serialize_fields = (
        "submission_id",
        "cluster",
        "ray_conn_id",
        "poll_interval",
        "timeout",
        "log_offset",
        "started_at",
        "restart_if_stopped",
        "end_task",
        "result_nonce",
        "unreachable_timeout",
    )

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
        end_task: dict[str, Any] | None = None,
        result_nonce: str | None = None,
        unreachable_timeout: float | None = UNREACHABLE_TIMEOUT_S,
    ) -> None:
        super().__init__()
        self.submission_id = submission_id
        self.cluster = cluster or {}
        self.ray_conn_id = ray_conn_id
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.log_offset = log_offset
        self.started_at = started_at if started_at is not None else time.time()
        self.restart_if_stopped = restart_if_stopped
        self.end_task = end_task
        self.result_nonce = result_nonce
        self.unreachable_timeout = unreachable_timeout
        self._cursor_broken = False

    def _hook(self) -> RayJobHook:
        return RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        offset = max(self.log_offset, await self._saved_offset())
        if offset > self.log_offset:
            self.log.info(
                "Resuming the driver log of %s at character %d (streamed before a restart)", self.submission_id, offset
            )
        hook = self._hook()
        # One HTTP session for the whole wait (a scripted reader in tests has none to open).
        async with hook if isinstance(hook, RayDashboardHook) else contextlib.nullcontext(hook):
            event = await wait_for_job(
                hook,
                self.submission_id,
                poll_interval=self.poll_interval,
                timeout=self.timeout,
                started_at=self.started_at,
                restart_if_stopped=self.restart_if_stopped,
                offset=offset,
                save_offset=self._save_offset,
                result_nonce=self.result_nonce,
                unreachable_timeout=self.unreachable_timeout,
                log=self.log,
            )
        yield await self.event(event)

    def task_end_xcoms(self, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """A SUCCEEDED job whose result passes the gate ends here; a stopped job to replace, or a result
        below the gate (the worker raises QualityGateError, one home for the message), resumes the task."""
        end = self.end_task or {}
        raw_result = payload.get("result")
        result: Mapping[str, Any] = raw_result if isinstance(raw_result, Mapping) else {}
        if payload.get("job_status") != "SUCCEEDED" or gate_failure(result, end.get("min_result")):
            return None
        xcoms: dict[str, Any] = {"return_value": dict(result)} if end.get("return_result") else {}
        span = job_work_span(str(end.get("work_cause", "job")), payload, self.submission_id)
        if span is not None:
            xcoms[WORK_SPAN_KEY] = span
        return xcoms

    def _xcom_address(self) -> dict[str, Any] | None:
        return None if self._cursor_broken else self.xcom_address()

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

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: stop the job it runs."""
        self.log.info("Stopping Ray job %s because the task was killed", self.submission_id)
        await self._hook().astop_job(self.submission_id)
