"""Waiting for Ray Serve applications: one coroutine for the trigger and for a worker that does not defer.

``wait_for_applications`` polls Serve's status until every named application is RUNNING, one is
DEPLOY_FAILED or UNHEALTHY, or the deadline passes with some still DEPLOYING (the event then says
which deployments are stuck and the usual causes). RayServeApplicationsTrigger.run awaits it in
the triggerer; RayServeDeployOperator.execute_sync runs it with ``asyncio.run``.

``wait_until_idle`` reads Serve's request counters until a kept endpoint has been idle for its window or reached
its lifetime (tpuflow.serve.idle): RayServeIdleTrigger.run in the triggerer, RayServeWaitForIdleOperator.execute_sync
in a worker.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol, cast

from tpuflow.events import EventStatus, TriggerEventPayload, make_event
from tpuflow.polling import poll_delays
from tpuflow.serve.idle import IdleWatch, serve_activity
from tpuflow.serve.status import STUCK_HINT, app_statuses, judge, placement_causes


class ServeEvent(TriggerEventPayload):
    """The event of a Serve wait (status success | failed | timeout, message: what each app is doing)."""

    app_statuses: dict[str, str]  # application name -> Serve's status (RUNNING, DEPLOYING, DEPLOY_FAILED, ...)


class ServeReader(Protocol):
    async def aget_serve_details(self) -> dict[str, Any]: ...


def _serve_event(status: EventStatus, message: str, statuses: dict[str, str], **fields: Any) -> ServeEvent:
    return cast(ServeEvent, make_event(status, message, app_statuses=statuses, **fields))


async def wait_for_applications(
    reader: ServeReader,
    app_names: list[str],
    *,
    timeout: float,
    started_at: float,
    poll_interval: float,
    log: Any,
) -> ServeEvent:
    """Poll until the applications are RUNNING, failed, or ``timeout`` seconds after ``started_at``."""
    last, statuses, causes = "", dict.fromkeys(app_names, "UNKNOWN"), []
    delays = poll_delays(poll_interval)
    while True:
        try:
            payload = await reader.aget_serve_details()
        except Exception as err:  # dashboard briefly unreachable; the deadline bounds this
            log.warning("Ray dashboard unreachable (%s); retrying", err)
        else:
            verdict, statuses = judge(payload, app_names), app_statuses(payload, app_names)
            causes = placement_causes(payload, app_names)
            if verdict.detail != last:
                log.info("Serve status:\n%s", verdict.detail)
                last = verdict.detail
            if verdict.state == "running":
                return _serve_event("success", verdict.detail, statuses)
            if verdict.state == "failed":
                # A failed deploy goes through the task's retries, as it always has: UNHEALTHY
                # replicas and a DEPLOY_FAILED on a busy cluster can pass.
                return _serve_event("failed", verdict.detail, statuses, retryable=True)
        if time.time() - started_at > timeout:
            return _serve_event(
                "timeout",
                "\n".join([f"not RUNNING after {timeout:.0f}s:", last or "no status yet", *causes]),
                statuses,
                diagnostics=STUCK_HINT,
            )
        await asyncio.sleep(next(delays))


class MetricsReader(Protocol):
    @property
    def metrics_url(self) -> str: ...

    async def aread_metrics(self) -> str: ...


async def wait_until_idle(
    reader: MetricsReader,
    watch: IdleWatch,
    *,
    poll_interval: float,
    unreadable_after: float,
    log: Any,
) -> dict[str, Any]:
    """Read Serve's metrics every ``poll_interval`` seconds until ``watch`` says idle or its lifetime ends:
    ``{"status": "success", "stopped": "idle" | "lifetime", "idle_s", "requests", "since"}``; or ``{"status":
    "error", "reason": "unreadable", "message"}`` once they could not be read for ``unreadable_after`` seconds.
    A failed read never shortens the window."""
    last_read = time.time()
    while True:
        now = time.time()
        if watch.is_expired(now):
            return _stopped("lifetime", watch, now)
        try:
            activity = serve_activity(await reader.aread_metrics())
        except Exception as err:  # the head restarting, a network blip, an answer over its size or time
            if now - last_read >= unreadable_after:
                return {
                    "status": "error",
                    "reason": "unreadable",
                    "message": f"the endpoint's metrics at {reader.metrics_url} could not be read for "
                    f"{now - last_read:.0f} s: {err}",
                }
            log.info("Serve metrics unreadable (%s); trying again", err)
        else:
            last_read = now
            if watch.observe(activity, now):
                log.info(
                    "Endpoint busy: %g successful answers so far, %g in flight", activity.requests, activity.ongoing
                )
            if watch.is_idle(now):
                return _stopped("idle", watch, now)
        until_deadline = watch.deadline - time.time() if watch.deadline is not None else poll_interval
        await asyncio.sleep(max(0.0, min(poll_interval, until_deadline)))


def _stopped(why: str, watch: IdleWatch, now: float) -> dict[str, Any]:
    return {
        "status": "success",
        "stopped": why,
        "idle_s": round(watch.idle_for(now), 1),
        "requests": watch.requests,
        "since": watch.since,
    }
