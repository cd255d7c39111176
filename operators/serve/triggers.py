"""Deferrable wait until Ray Serve applications are RUNNING (or failed, or stuck past a deadline).

Kill semantics: a user marking the deferred deploy task failed/success or clearing it makes the
triggerer call ``on_kill``, which deletes the applications the task created (``delete_on_kill``: the
app names absent before its PUT). Serve's REST API deletes all applications at once, so this is done
only when every app on the cluster is one of those; an app the task merely updated keeps serving.
``cleanup()`` is not overridden: it also runs on triggerer restarts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.serve.status import STUCK_HINT, deletable_on_kill, judge


class RayServeApplicationsTrigger(BaseTrigger):
    def __init__(
        self,
        app_names: list[str],
        cluster: dict[str, Any] | None = None,
        ray_conn_id: str | None = None,
        timeout: float = 600.0,
        poll_interval: float = 2.0,
        started_at: float | None = None,
        delete_on_kill: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.app_names = list(app_names)
        self.cluster = cluster or {}
        self.ray_conn_id = ray_conn_id
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.started_at = started_at if started_at is not None else time.time()
        self.delete_on_kill = list(delete_on_kill) if delete_on_kill else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "app_names": self.app_names,
                "cluster": self.cluster,
                "ray_conn_id": self.ray_conn_id,
                "timeout": self.timeout,
                "poll_interval": self.poll_interval,
                "started_at": self.started_at,
                "delete_on_kill": self.delete_on_kill,
            },
        )

    async def on_kill(self) -> None:
        """The user marked the deferred task failed/success or cleared it: delete the apps it created."""
        if not self.delete_on_kill:
            return
        hook = RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster)
        payload = await hook.aget_serve_applications()
        if not deletable_on_kill(payload, self.delete_on_kill):
            present = sorted((payload.get("applications") or {}).keys())
            self.log.info("Task killed; Serve applications %s are not all this task's, leaving them", present)
            return
        self.log.warning("Task killed: deleting Serve applications %s", self.delete_on_kill)
        await hook.adelete_serve_applications()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster)
        last = ""
        while True:
            try:
                verdict = judge(await hook.aget_serve_applications(), self.app_names)
            except Exception as err:  # dashboard briefly unreachable; the deadline bounds this
                self.log.warning("Ray dashboard unreachable (%s); retrying", err)
                verdict = None
            if verdict is not None:
                if verdict.detail != last:
                    self.log.info("Serve status:\n%s", verdict.detail)
                    last = verdict.detail
                if verdict.state in ("running", "failed"):
                    yield TriggerEvent({"status": verdict.state, "detail": verdict.detail})
                    return
            if time.time() - self.started_at > self.timeout:
                yield TriggerEvent(
                    {
                        "status": "timeout",
                        "detail": f"not RUNNING after {self.timeout:.0f}s:\n{last or 'no status yet'}\n{STUCK_HINT}",
                    }
                )
                return
            await asyncio.sleep(self.poll_interval)
