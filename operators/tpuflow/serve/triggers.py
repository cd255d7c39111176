"""Deferrable wait until Ray Serve applications are RUNNING (or failed, or stuck past a deadline).

Kill semantics: a user marking the deferred deploy task failed/success or clearing it makes the
triggerer call ``on_kill``, which deletes the applications the task created (``delete_on_kill``: the
app names absent before its PUT; None when the operator's ``on_kill_action`` is "keep"). Serve's
REST API deletes all applications at once, so this is done only when every app on the cluster is
one of those; an app the task merely updated keeps serving. ``cleanup()`` is not overridden: it also
runs on triggerer restarts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from tpuflow.deprecations import warn_renamed_keyword
from tpuflow.serve.hooks import RayServeHook
from tpuflow.serve.idle import IdleWatch
from tpuflow.serve.metrics_read import METRICS_TIMEOUT_S, ServeMetricsReader
from tpuflow.serve.status import deletable_on_kill
from tpuflow.serve.waits import wait_for_applications, wait_until_idle
from tpuflow.triggers import TpuflowTrigger


class RayServeApplicationsTrigger(TpuflowTrigger):
    """Polls Serve until ``app_names`` are RUNNING (``tpuflow.serve.waits.wait_for_applications``).

    :param app_names: the applications to wait for.
    :param cluster: the cluster-start task's connection info (dashboard_url, auth_token_path).
    :param ray_conn_id: Airflow connection naming the dashboard, when ``cluster`` does not.
    :param timeout: seconds after ``started_at`` until the wait ends as ``timeout`` with what is stuck.
    :param poll_interval: seconds between polls.
    :param started_at: epoch seconds the wait began; default now.
    :param delete_on_kill: the applications a kill deletes (those the task created); None: none.
    :param end_task: ``{"xcoms": {...}}``: once every app is RUNNING, end the task here with these XComs
        (``tpuflow.triggers``); None: the task resumes on a worker.
    """

    serialize_fields = (
        "app_names",
        "cluster",
        "ray_conn_id",
        "timeout",
        "poll_interval",
        "started_at",
        "delete_on_kill",
        "end_task",
    )

    def __init__(
        self,
        app_names: list[str],
        cluster: dict[str, Any] | None = None,
        ray_conn_id: str | None = None,
        timeout: float = 600.0,
        poll_interval: float = 2.0,
        started_at: float | None = None,
        delete_on_kill: list[str] | None = None,
        end_task: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.app_names = list(app_names)
        self.cluster = cluster or {}
        self.ray_conn_id = ray_conn_id
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.started_at = started_at if started_at is not None else time.time()
        self.delete_on_kill = list(delete_on_kill) if delete_on_kill else None
        self.end_task = end_task

    def _hook(self) -> RayServeHook:
        return RayServeHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async with self._hook() as hook:  # one HTTP session for the whole wait
            event = await wait_for_applications(
                hook,
                self.app_names,
                timeout=self.timeout,
                started_at=self.started_at,
                poll_interval=self.poll_interval,
                log=self.log,
            )
        yield await self.event(event)

    async def on_kill(self) -> None:
        """The user marked the deferred task failed/success or cleared it: delete the apps it created."""
        if not self.delete_on_kill:
            return
        hook = self._hook()
        payload = await hook.aget_serve_details()
        if not deletable_on_kill(payload, self.delete_on_kill):
            present = sorted((payload.get("applications") or {}).keys())
            self.log.info("Task killed; Serve applications %s are not all this task's, leaving them", present)
            return
        self.log.warning("Task killed: deleting Serve applications %s", self.delete_on_kill)
        await hook.adelete_applications()


class RayServeIdleTrigger(TpuflowTrigger):
    """Waits until a kept endpoint has answered no request successfully for ``idle_timeout_s`` seconds, or has
    reached its ``deadline`` (tpuflow.serve.idle).

    Reads the head's Prometheus exporter (``metrics_url``, resolved by RayServeHook from the cluster info or the
    connection) every ``poll_interval`` seconds, without the cluster's token and at most ``metrics_timeout``
    seconds and tpuflow.serve.metrics_read.MAX_METRICS_BYTES a read. Fires ``{"status": "success", "stopped":
    "idle" | "lifetime", "idle_s", "requests", "since"}`` once idle for ``idle_timeout_s`` + ``margin`` seconds or
    at ``deadline``, or ``{"status": "error", "reason": "unreadable", "message"}`` when the metrics could not be
    read for ``unreadable_after`` seconds (the cluster is gone or unreachable).

    The window's start (``since``), the count then (``requests``) and the deadline are kwargs, so a triggerer
    that restarts rebuilds the wait from them: a count unchanged since ``since`` keeps the window, a changed one
    restarts it (later, never sooner), and the deadline stays where it was.

    :param cluster: where the endpoint's cluster is (its ``metrics_url``); see RayServeHook.
    :param ray_conn_id: Airflow connection naming it, when ``cluster`` does not.
    :param idle_timeout_s: seconds without a successful answer that make the endpoint idle (``idle_timeout``,
        its name before, is still accepted for one release with a deprecation warning: a trigger the previous
        release serialised is rebuilt from it).
    :param since: epoch seconds the window began (the watch's start).
    :param requests: Serve's count of successful answers at ``since`` (None: not read yet).
    :param poll_interval: seconds between reads.
    :param margin: seconds added to the window for Ray's metric export delay.
    :param unreadable_after: seconds of failed reads that end the wait as an error.
    :param deadline: epoch seconds the endpoint's lifetime ends (None: never; the operator always sets one).
    :param metrics_timeout: seconds of wall clock one read of the metrics may take.
    """

    serialize_fields = (
        "cluster",
        "ray_conn_id",
        "idle_timeout_s",
        "since",
        "requests",
        "poll_interval",
        "margin",
        "unreadable_after",
        "deadline",
        "metrics_timeout",
    )

    def __init__(
        self,
        *,
        since: float,
        idle_timeout_s: float | None = None,
        cluster: dict[str, Any] | None = None,
        ray_conn_id: str | None = None,
        requests: float | None = None,
        poll_interval: float = 30.0,
        margin: float = 30.0,
        unreadable_after: float = 600.0,
        deadline: float | None = None,
        metrics_timeout: float = METRICS_TIMEOUT_S,
        idle_timeout: float | None = None,
    ) -> None:
        super().__init__()
        if idle_timeout is not None:  # its name before it carried its unit
            warn_renamed_keyword(type(self).__name__, "idle_timeout", "idle_timeout_s")
            idle_timeout_s = idle_timeout if idle_timeout_s is None else idle_timeout_s
        if idle_timeout_s is None:
            raise TypeError(
                f"{type(self).__name__} needs idle_timeout_s: the seconds without an answer that make the endpoint idle"
            )
        self.cluster = cluster or {}
        self.ray_conn_id = ray_conn_id
        self.idle_timeout_s = float(idle_timeout_s)
        self.since = float(since)
        self.requests = requests
        self.poll_interval = float(poll_interval)
        self.margin = float(margin)
        self.unreadable_after = float(unreadable_after)
        self.deadline = float(deadline) if deadline is not None else None
        self.metrics_timeout = float(metrics_timeout)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = IdleWatch(self.idle_timeout_s, self.since, self.requests, self.margin, deadline=self.deadline)
        url = RayServeHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster).metrics_url
        event = await wait_until_idle(
            ServeMetricsReader(url, timeout=self.metrics_timeout),
            watch,
            poll_interval=self.poll_interval,
            unreadable_after=self.unreadable_after,
            log=self.log,
        )
        yield TriggerEvent(event)
