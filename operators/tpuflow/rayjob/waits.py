"""Waiting for a Ray job: one coroutine for the trigger and for a worker that does not defer.

``wait_for_job`` polls the job until it ends (or the deadline), writes each new driver-log line to
the given log as it appears, reports how far the log has streamed (the trigger keeps that cursor
in an XCom), and returns one event of the shape in ``tpuflow.events``. RayJobTrigger.run awaits
it in the triggerer; RaySubmitJobOperator.execute_sync runs it with ``asyncio.run``.

The driver log arrives through Ray's log tail (``atail_job_logs``: the dashboard pushes each new
chunk once), not by downloading the whole log every poll; only what the event needs of it (the
last lines, the last ``TPUFLOW_RESULT`` line carrying the job's nonce) is kept, so a wait's memory does not grow
with the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NotRequired, Protocol, cast

from tpuflow.events import EventStatus, TriggerEventPayload, make_event
from tpuflow.rayjob import UNREACHABLE_TIMEOUT_S
from tpuflow.rayjob.failures import is_user_code_error
from tpuflow.rayjob.hooks import (
    RESULT_MARKER,
    TERMINAL_JOB_STATES,
    LogTailBusy,
    log_tail,
    parse_result,
    strip_ansi,
)
from tpuflow.rayjob.secret_env import amask_job_secrets

# HTTP statuses of the dashboard that a later poll may not see again (busy, restarting).
_TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
# Lines of the driver log an event carries (log_tail) and failure classification reads.
TAIL_LINES = 40
# After the job ends, how long the log tail may take to deliver the rest (Ray's tail re-reads the
# file about once a second) before the wait fetches the whole log once instead.
_TAIL_DRAIN_S = 15.0
# A log shorter than this when the job ends is fetched whole instead (see _drain).
_SMALL_LOG_CHARS = 1 << 20
# Tail connections that fail in a row before the wait falls back to fetching the whole log per poll
# (e.g. a proxy in front of the dashboard that refuses websocket upgrades).
_TAIL_FAILURES_BEFORE_POLLING = 3


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
    job_span: NotRequired[list[float]]  # [start, end] unix seconds by Ray's clock, for a job that ended


class JobReader(Protocol):
    async def aget_job_info(self, submission_id: str) -> dict[str, Any] | None: ...

    async def aget_job_logs(self, submission_id: str) -> str: ...

    def atail_job_logs(self, submission_id: str) -> AsyncIterator[str]:
        """The driver log from its start, chunk by chunk as it is written; ends once the job ended
        and its whole log was sent."""
        ...

    async def astop_job(self, submission_id: str) -> None: ...


def _job_event(
    status: EventStatus, message: str, submission_id: str, job_status: str, logs: str, **fields: Any
) -> RayJobEvent:
    """``logs``: the end of the driver log (at least its last TAIL_LINES lines)."""
    tail = log_tail(logs, TAIL_LINES)
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


def job_span(info: Mapping[str, Any]) -> list[float] | None:
    """[start, end] of an ended job in unix seconds, from Ray's job details (milliseconds); None if unknown."""
    start, end = info.get("start_time"), info.get("end_time")
    if not isinstance(start, int | float) or not isinstance(end, int | float) or isinstance(start, bool):
        return None
    return [start / 1000.0, end / 1000.0]


def _ended(
    submission_id: str, job_status: str, message: str, logs: str, restart_if_stopped: bool, result: dict[str, Any]
) -> RayJobEvent:
    """The event of a job that reached a terminal state (``logs``: the end of its driver log)."""
    if job_status == "SUCCEEDED":
        return _job_event(
            "success", f"Ray job {submission_id} succeeded", submission_id, job_status, logs, result=result
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
    user_error = is_user_code_error(job_status, message, log_tail(logs, TAIL_LINES))
    return _job_event("failed", text, submission_id, job_status, logs, retryable=not user_error)


class LogFollower:
    """One wait's view of a job's driver log, fed the log's text in order from its first character.

    ``offset`` (characters already in the task log) is the trigger's cursor: text before it is
    read for the event (last lines, result) but not logged again. Only whole lines are logged; a
    line still being written waits for its end (or for the job's end). ``nonce``: the job's result
    nonce; only a result line carrying it is the job's result (``tpuflow.rayjob.hooks.parse_result``).
    """

    def __init__(self, offset: int, nonce: str | None = None) -> None:
        self.offset = offset  # characters of the log that are in the task log
        self.nonce = nonce
        self.unproven_results = 0  # result-shaped lines without the job's nonce (not taken)
        self.seen = 0  # characters of the log received so far
        self._partial = ""  # received text after the last newline
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._result_line = ""
        self.tailing = False  # a log tail is delivering the log (else the end is fetched whole)

    def feed(self, chunk: str, at: int) -> list[str]:
        """Take the log's characters ``at .. at+len(chunk)`` (a repeat of text already seen is
        skipped); returns the complete new lines to log, without their newlines."""
        if at + len(chunk) <= self.seen:
            return []
        chunk = chunk[self.seen - at :] if at < self.seen else chunk
        start = self.seen - len(self._partial)  # log position of the text being split
        text = self._partial + chunk
        self.seen += len(chunk)
        complete, _, self._partial = text.rpartition("\n")
        return self._lines(complete, start, len(complete) + 1) if _ else []

    def finish(self) -> list[str]:
        """The log ended: its last line, when it has no newline."""
        if not self._partial:
            return []
        start, text = self.seen - len(self._partial), self._partial
        self._partial = ""
        return self._lines(text, start, len(text))

    def _lines(self, text: str, start: int, consumed: int) -> list[str]:
        lines = text.split("\n")
        self._tail.extend(lines[-TAIL_LINES:])
        if RESULT_MARKER in text:
            marked = [line for line in lines if RESULT_MARKER in line]
            proven = [line for line in marked if parse_result(line, self.nonce)]
            self.unproven_results += len(marked) - len(proven)
            self._result_line = proven[-1] if proven else self._result_line
        new_from = self.offset - start  # characters of `text` already in the task log
        self.offset = max(self.offset, start + consumed)
        if new_from <= 0:
            return lines
        if new_from >= consumed:
            return []
        return text[new_from:].split("\n")

    @property
    def tail(self) -> str:
        """The end of the log: its last lines, a line still being written included."""
        return "\n".join([*self._tail, self._partial])

    @property
    def result(self) -> dict[str, Any]:
        return parse_result(self._result_line, self.nonce)


async def _follow(
    reader: JobReader,
    submission_id: str,
    follower: LogFollower,
    emit: Callable[[list[str]], Awaitable[None]],
    *,
    retry_after: float,
    log: Any,
) -> None:
    """Feed the job's log tail to ``follower`` until the job ended and its log is complete.

    A dropped connection reconnects (the tail starts again at the log's first character; the
    follower skips what it saw). When the tail cannot be had, the whole log is fetched once per
    ``retry_after`` instead, as the wait did before tails.
    """
    failures = 0
    while True:
        try:
            try:
                if failures >= _TAIL_FAILURES_BEFORE_POLLING:
                    raise LogTailBusy("no tail")
                at = 0
                async for chunk in reader.atail_job_logs(submission_id):
                    failures, follower.tailing = 0, True
                    await emit(follower.feed(chunk, at))
                    at += len(chunk)
                # Ray ends a tail when the job ended and its log was read to the end; a relay that
                # lost its node agent ends it too, so ask.
                info = await reader.aget_job_info(submission_id)
            except LogTailBusy:  # this round, the whole log (the tail is tried again next round)
                follower.tailing = False
                info = await reader.aget_job_info(submission_id)
                await emit(follower.feed(await reader.aget_job_logs(submission_id), 0))
            if info is None or str(info.get("status")) in TERMINAL_JOB_STATES:
                return
        except asyncio.CancelledError:
            raise
        except Exception as err:
            failures, follower.tailing = failures + 1, False
            if failures == _TAIL_FAILURES_BEFORE_POLLING:
                log.warning(
                    "The driver log tail of %s failed (%s); fetching the whole log each poll", submission_id, err
                )
            elif failures < _TAIL_FAILURES_BEFORE_POLLING:
                log.info("The driver log tail of %s was interrupted (%s); reconnecting", submission_id, err)
        await asyncio.sleep(retry_after)


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
    result_nonce: str | None = None,
    unreachable_timeout: float | None = UNREACHABLE_TIMEOUT_S,
    log: Any,
) -> RayJobEvent:
    """Poll the job until it is SUCCEEDED, FAILED or STOPPED, or ``timeout`` seconds after
    ``started_at`` (then the job is stopped), or until the dashboard has not answered for ``unreachable_timeout``
    seconds in a row (a retryable failure: the head is gone or answers elsewhere now; None: wait on).
    Driver-log characters past ``offset`` go to ``log`` line by line as the log tail delivers them; ``save_offset`` hears the offset reached after the
    lines were logged, at most once per ``poll_interval`` and when the wait ends (also by
    cancellation, as when the triggerer stops), so a crash repeats at most one interval's lines.
    ``result_nonce``: the job's result nonce (its metadata); only a result line carrying it is the result."""
    follower = LogFollower(offset, result_nonce)
    saved = {"offset": offset, "at": time.monotonic()}

    async def save(force: bool = False) -> None:
        if save_offset is None or follower.offset == saved["offset"]:
            return
        if force or time.monotonic() - saved["at"] >= poll_interval:
            saved.update(offset=follower.offset, at=time.monotonic())
            await save_offset(follower.offset)

    async def emit(lines: list[str]) -> None:
        if not lines:
            return
        for line in lines:
            for part in strip_ansi(line).splitlines() or [""]:
                log.info("[ray job] %s", part)
        await save()

    tail = asyncio.ensure_future(_follow(reader, submission_id, follower, emit, retry_after=poll_interval, log=log))
    try:
        return await _poll(reader, submission_id, follower, tail, emit, poll_interval=poll_interval, timeout=timeout,
                           started_at=started_at, restart_if_stopped=restart_if_stopped,
                           unreachable_timeout=unreachable_timeout, log=log)  # fmt: skip
    finally:
        await _cancel(tail)
        await save(force=True)


async def _poll(
    reader: JobReader,
    submission_id: str,
    follower: LogFollower,
    tail: asyncio.Future[None],
    emit: Callable[[list[str]], Awaitable[None]],
    *,
    poll_interval: float,
    timeout: float | None,
    started_at: float,
    restart_if_stopped: bool,
    unreachable_timeout: float | None,
    log: Any,
) -> RayJobEvent:
    job_status = "UNKNOWN"
    masked = False
    unreachable_since: float | None = None
    while True:
        try:
            info = await reader.aget_job_info(submission_id)
        except Exception as err:
            code = getattr(err, "status", None)
            if isinstance(code, int) and code not in _TRANSIENT_HTTP:  # e.g. 401/403: no later poll will do better
                return _job_event(
                    "error",
                    f"the Ray dashboard refused to report job {submission_id}: {err}",
                    submission_id,
                    job_status,
                    follower.tail,
                )
            unreachable_since = time.monotonic() if unreachable_since is None else unreachable_since
            if unreachable_timeout is not None and time.monotonic() - unreachable_since >= unreachable_timeout:
                return _job_event(
                    "failed",
                    f"the Ray dashboard has not answered for {unreachable_timeout:g} s ({err}): the cluster's head is "
                    "gone, or was replaced and answers at a new address; a retry of the task reaches the cluster "
                    "where it is now and re-attaches to the job, or submits it again if the head lost it",
                    submission_id,
                    job_status,
                    follower.tail,
                    retryable=True,
                )
            log.warning("Ray dashboard unreachable (%s); retrying", err)
            info = {"status": job_status}
        else:
            unreachable_since = None
        if info is None:
            return _job_event(
                "failed",
                "the Ray cluster no longer knows this job: its head restarted or was replaced (Ray keeps its jobs"
                " on the head), so the job's driver is gone; a retry of the task submits the job again",
                submission_id,
                "FAILED",
                follower.tail,
                retryable=True,
            )
        if not masked and isinstance(info.get("runtime_env"), Mapping):
            masked = True  # the job's own secret values read *** in the driver lines this wait logs
            await amask_job_secrets(info)
        job_status = str(info.get("status", "UNKNOWN"))
        if job_status in TERMINAL_JOB_STATES:
            await _drain(reader, submission_id, follower, tail, emit)
            if job_status == "SUCCEEDED" and follower.unproven_results and not follower.result:
                log.warning(
                    "Ray job %s printed %d TPUFLOW_RESULT line(s) without its result nonce: none is its result "
                    "(a worker's output, or a line printed by hand; print the result from the driver with "
                    "tpuflow_driver.result.emit_result)",
                    submission_id,
                    follower.unproven_results,
                )
            event = _ended(
                submission_id,
                job_status,
                str(info.get("message") or ""),
                follower.tail,
                restart_if_stopped,
                follower.result,
            )
            span = job_span(info)
            if span is not None:
                event["job_span"] = span
            return event
        if timeout is not None and time.time() - started_at > timeout:
            await reader.astop_job(submission_id)
            return _job_event(
                "timeout", f"job exceeded {timeout:.0f}s and was stopped", submission_id, job_status, follower.tail
            )
        if tail.done():
            await asyncio.sleep(poll_interval)
        else:  # the tail ends when the job does: poll at once then rather than at the next interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(tail), poll_interval)


async def _cancel(future: asyncio.Future[Any]) -> None:
    """Cancel `future` and wait until it has stopped, whatever it ended with."""
    future.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await future


async def _drain(
    reader: JobReader,
    submission_id: str,
    follower: LogFollower,
    tail: asyncio.Future[None],
    emit: Callable[[list[str]], Awaitable[None]],
) -> None:
    """The job ended: let the tail deliver the rest of its log, or else fetch the whole log once.

    A log still short when the job ended (under ``_SMALL_LOG_CHARS`` seen) is also fetched whole at once, and
    whichever of the fetch and the tail ends first gives the log's end: the file is complete once Ray reports
    the job terminal, while Ray's tail loop closes up to seconds later (it re-reads the file once a second and
    asks the job's status in between; 3 s under 20 concurrent tails), and the task's end waits for the event.
    Racing the two matters when many jobs end at once: with 20, the busy dashboard answered the fetch
    0.2-0.4 s after the tail's last chunk."""
    if not tail.done() and follower.seen < _SMALL_LOG_CHARS:
        fetch = asyncio.ensure_future(reader.aget_job_logs(submission_id))
        racers: list[asyncio.Future[Any]] = [fetch, tail]
        await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
        whole = fetch.result() if fetch.done() and not fetch.exception() else None
        if whole is not None:
            await _cancel(tail)
            await emit(follower.feed(whole, 0))
            await emit(follower.finish())
            return
        await _cancel(fetch)
    try:
        if not (tail.done() or follower.tailing):
            raise ConnectionError("no log tail is delivering the log")
        await asyncio.wait_for(asyncio.shield(tail), _TAIL_DRAIN_S)
    except Exception:
        await _cancel(tail)
        with contextlib.suppress(Exception):
            await emit(follower.feed(await reader.aget_job_logs(submission_id), 0))
    await emit(follower.finish())
