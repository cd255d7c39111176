"""Waiting for a Ray job: one coroutine for the trigger and for a worker that does not defer.

``wait_for_job`` polls the job until it ends (or the deadline), writes each new driver-log line to
the given log as it appears, reports how far the log has streamed (the trigger keeps that cursor
in an XCom), and returns one event of the shape in ``tpuflow.events``. RayJobTrigger.run awaits
it in the triggerer; RaySubmitJobOperator.execute_sync runs it with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, NotRequired, Protocol, cast

from tpuflow.events import EventStatus, TriggerEventPayload, make_event
from tpuflow.rayjob.failures import is_user_code_error
from tpuflow.rayjob.hooks import TERMINAL_JOB_STATES, log_tail, parse_result, strip_ansi

# HTTP statuses of the dashboard that a later poll may not see again (busy, restarting).
_TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})


class RayJobEvent(TriggerEventPayload):
    """The event of a Ray job wait (status success | failed | timeout | error, message, ...).

    ``success`` with ``job_status`` SUCCEEDED carries the job's ``result``; ``success`` with
    ``job_status`` STOPPED happens only for a ``restart_if_stopped`` wait: the job this try
    re-attached to was stopped by an earlier try's kill, and the task submits a fresh one.
    """

    submission_id: str
    job_status: str  # Ray's JobStatus when the wait ended (SUCCEEDED, FAILED, STOPPED, RUNNING, ...)
    log_tail: NotRequired[str]
    result: NotRequired[dict[str, Any]]


class JobReader(Protocol):
    async def aget_job_info(self, submission_id: str) -> dict[str, Any] | None: ...

    async def aget_job_logs(self, submission_id: str) -> str: ...

    async def astop_job(self, submission_id: str) -> None: ...


def _job_event(
    status: EventStatus, message: str, submission_id: str, job_status: str, logs: str, **fields: Any
) -> RayJobEvent:
    tail = log_tail(logs)
    diagnostics = f"--- last lines of the driver log ---\n{tail}" if tail else ""
    return cast(
        RayJobEvent,
        make_event(
            status,
            message,
            submission_id=submission_id,
            job_status=job_status,
            log_tail=tail,
            diagnostics=diagnostics,
            **fields,
        ),
    )


def _ended(submission_id: str, job_status: str, message: str, logs: str, restart_if_stopped: bool) -> RayJobEvent:
    """The event of a job that reached a terminal state."""
    if job_status == "SUCCEEDED":
        return _job_event(
            "success", f"Ray job {submission_id} succeeded", submission_id, job_status, logs, result=parse_result(logs)
        )
    if job_status == "STOPPED" and restart_if_stopped:
        return _job_event(
            "success",
            f"Ray job {submission_id}, which this try re-attached to, was stopped (an "
            "earlier try was killed or cleared); a fresh job replaces it",
            submission_id,
            job_status,
            logs,
        )
    text = f"ended {job_status}: {message}"
    # A traceback of the user's code and no sign of lost infrastructure: a retry would fail the same way.
    user_error = is_user_code_error(job_status, message, log_tail(logs))
    return _job_event("failed", text, submission_id, job_status, logs, retryable=not user_error)


async def wait_for_job(
    reader: JobReader,
    submission_id: str,
    *,
    poll_interval: float,
    timeout: float | None,
    started_at: float,
    restart_if_stopped: bool = False,
    offset: int = 0,
    save_offset: Callable[[int], Awaitable[None]] | None = None,
    log: Any,
) -> RayJobEvent:
    """Poll the job until it is SUCCEEDED, FAILED or STOPPED, or ``timeout`` seconds after
    ``started_at`` (then the job is stopped). Driver-log characters past ``offset`` go to ``log``
    line by line; ``save_offset`` hears the new offset after each poll that streamed some."""
    logs, job_status = "", "UNKNOWN"
    while True:
        try:
            info = await reader.aget_job_info(submission_id)
            logs = await reader.aget_job_logs(submission_id)
        except Exception as err:
            code = getattr(err, "status", None)
            if isinstance(code, int) and code not in _TRANSIENT_HTTP:  # e.g. 401/403: no later poll will do better
                return _job_event(
                    "error",
                    f"the Ray dashboard refused to report job {submission_id}: {err}",
                    submission_id,
                    job_status,
                    logs,
                )
            log.warning("Ray dashboard unreachable (%s); retrying", err)  # the deadline bounds this
            info = {"status": job_status}
        if len(logs) > offset:
            for line in strip_ansi(logs[offset:]).rstrip("\n").splitlines():
                log.info("[ray job] %s", line)
            offset = len(logs)
            if save_offset is not None:
                await save_offset(offset)
        if info is None:
            return _job_event(
                "failed", f"Ray job {submission_id} no longer exists", submission_id, "FAILED", logs, retryable=True
            )
        job_status = str(info.get("status", "UNKNOWN"))
        if job_status in TERMINAL_JOB_STATES:
            return _ended(submission_id, job_status, str(info.get("message") or ""), logs, restart_if_stopped)
        if timeout is not None and time.time() - started_at > timeout:
            await reader.astop_job(submission_id)
            return _job_event(
                "timeout", f"job exceeded {timeout:.0f}s and was stopped", submission_id, job_status, logs
            )
        await asyncio.sleep(poll_interval)
