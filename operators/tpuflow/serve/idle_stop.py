"""Keep an endpoint while it serves: the deferrable wait that ends a kept endpoint's life once it is idle.

Why a deferrable task in the run rather than the orphan reaper's job: the wait is exact (the window is read
every few seconds, where the reaper passes hourly), it holds no worker slot (the triggerer polls), it
survives a scheduler or triggerer restart (the trigger is rebuilt from its kwargs, the window's start among
them), and when it ends the run's own teardowns delete the endpoint and its slice and the run's ledger closes
with the reason, as for any other run. The run stays running while the endpoint is kept; the reaper still
leaves what is kept, and a kept endpoint without ``idle_timeout`` runs until someone deletes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.errors import UserInputError
from tpuflow.ray.connection import check_cluster
from tpuflow.templating import is_true
from tpuflow.validation import check_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.serve.hooks import RayServeHook

NOT_KEPT = "not kept: keep_endpoint is off, or the endpoint never answered"


def idle_minutes(value: Any) -> float | None:
    """``idle_timeout`` as minutes: None (or "", 0) for never; a bad value is one line naming the field."""
    if value in (None, "", "None"):
        return None
    try:
        minutes = float(value)
    except (TypeError, ValueError):
        minutes = -1.0
    if minutes < 0 or minutes != minutes:
        raise UserInputError(
            "idle_timeout", value, "give the minutes without a request after which a kept endpoint stops (0: never)"
        )
    return minutes or None


class RayServeWaitForIdleOperator(ArgumentChecks, BaseOperator):
    """Decide whether the run's teardowns keep its endpoint, and while kept, wait until it is idle.

    Returns ``{"keep": bool, "reason", ...}``; the teardowns keep the endpoint (and its slice) only when
    ``keep`` is true. Not kept (``keep`` renders false): returns at once. Kept without ``idle_timeout``: returns
    ``keep: True`` at once (the endpoint runs until deleted). Kept with ``idle_timeout``: defers on
    RayServeIdleTrigger until Serve's proxy has answered no request (health checks aside) for that many
    minutes, then returns ``keep: False, stopped: "idle"`` with the idle seconds, the request count and when it
    was last seen busy. Metrics that cannot be read for ``unreadable_after`` seconds fail the task, and the
    teardowns (which then find no ``keep``) delete the endpoint: a watch that cannot see it cannot vouch for it.

    :param cluster: templated; where the endpoint's cluster is: an XCom with ``metrics_url`` (the local
        cluster's start task, a RayService deploy).
    :param keep: templated; whether the endpoint is to be kept at all (keep_endpoint and it answered).
    :param idle_timeout: templated; minutes without a request after which the kept endpoint goes; None / 0:
        never.
    :param ray_conn_id: Airflow connection naming the cluster (extra ``metrics_url``), when ``cluster`` does not.
    :param poll_interval: seconds between metric reads; default a tenth of the window, 5 to 60 s.
    :param margin: seconds added to the window for Ray's metric export delay.
    :param unreadable_after: seconds of unreadable metrics that end the watch as failed.
    :param deferrable: wait in the triggerer (default); False: in the worker, with the same wait.
    """

    template_fields: Sequence[str] = ("cluster", "keep", "idle_timeout")
    ui_color = "#e2f0d9"

    def __init__(
        self,
        *,
        cluster: Any = None,
        keep: Any = False,
        idle_timeout: Any = None,
        ray_conn_id: str | None = None,
        poll_interval: float | None = None,
        margin: float = 30.0,
        unreadable_after: float = 600.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster
        self.keep = keep
        self.idle_timeout = idle_timeout
        self.ray_conn_id = ray_conn_id
        self.poll_interval = poll_interval
        self.margin = margin
        self.unreadable_after = unreadable_after
        self.deferrable = deferrable

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.idle_timeout,), lambda: idle_minutes(self.idle_timeout)),
            ((), self._check_waiting),
        ]

    def _check_waiting(self) -> None:
        if self.poll_interval is not None:
            check_seconds("poll_interval", self.poll_interval)
        check_seconds("margin", self.margin, allow_zero=True)
        check_seconds("unreadable_after", self.unreadable_after)

    def hook(self) -> RayServeHook:
        from tpuflow.serve.hooks import RayServeHook

        return RayServeHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster or None)

    def execute(self, context: Context) -> dict[str, Any]:
        from tpuflow.serve.idle import poll_interval_for, serve_activity

        self.validate_arguments()
        if not is_true(self.keep):
            return {"keep": False, "reason": NOT_KEPT}
        minutes = idle_minutes(self.idle_timeout)
        if minutes is None:
            self.log.info("keep_endpoint without idle_timeout: the endpoint runs until it is deleted")
            return {"keep": True, "idle_timeout_min": None, "reason": "kept; no idle_timeout"}
        check_cluster(self.cluster, self.ray_conn_id)
        hook = self.hook()
        window = minutes * 60
        wait = {
            "idle_timeout": window,
            "since": time.time(),
            "requests": serve_activity(asyncio.run(hook.aread_metrics())).requests,
            "poll_interval": self.poll_interval or poll_interval_for(window),
            "margin": self.margin,
            "unreadable_after": self.unreadable_after,
        }
        self.log.info(
            "Keeping the endpoint %s while it serves: it goes after %g min without a request (Serve's request "
            "count at %s: %g now)",
            (self.cluster or {}).get("serve_url", "") if isinstance(self.cluster, dict) else "",
            minutes,
            hook.metrics_url,
            wait["requests"],
        )
        if self.deferrable:
            self.execute_async(context, wait)
        return self.execute_sync(context, wait)

    def execute_async(self, context: Context, wait: dict[str, Any]) -> None:
        """Defer: RayServeIdleTrigger reads the metrics in the triggerer; nothing holds a worker meanwhile."""
        from tpuflow.serve.triggers import RayServeIdleTrigger

        self.defer(
            trigger=RayServeIdleTrigger(cluster=self.cluster or None, ray_conn_id=self.ray_conn_id, **wait),
            method_name="execute_complete",
        )

    def execute_sync(self, context: Context, wait: dict[str, Any]) -> dict[str, Any]:
        """Wait in this worker: the trigger's own wait, run here."""
        from tpuflow.serve.idle import IdleWatch
        from tpuflow.serve.waits import wait_until_idle

        watch = IdleWatch(wait["idle_timeout"], wait["since"], wait["requests"], wait["margin"])
        event = asyncio.run(
            wait_until_idle(
                self.hook(),
                watch,
                poll_interval=wait["poll_interval"],
                unreadable_after=wait["unreadable_after"],
                log=self.log,
            )
        )
        return self.execute_complete(context, event)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        from airflow.exceptions import AirflowException

        if event.get("status") != "success":
            raise AirflowException(f"Stopped watching the kept endpoint: {event.get('message')}; it is torn down")
        minutes = idle_minutes(self.idle_timeout) or 0
        reason = f"idle: no request for {minutes:g} min (idle_timeout)"
        self.log.info("%s; the teardowns delete the endpoint and its slice", reason)
        return {
            "keep": False,
            "stopped": "idle",
            "idle_timeout_min": minutes,
            "idle_s": event.get("idle_s"),
            "requests": event.get("requests"),
            "last_busy_at": event.get("since"),
            "stopped_at": time.time(),
            "reason": reason,
        }
