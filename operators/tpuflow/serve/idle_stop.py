"""Keep an endpoint while it serves: the deferrable wait that ends a kept endpoint's life once it is idle, or
once it has been kept for its lifetime.

Why a deferrable task in the run rather than the orphan reaper's job: the wait is exact (the window is read
every few seconds, where the reaper passes hourly), it holds no worker slot (the triggerer polls), it
survives a scheduler or triggerer restart (the trigger is rebuilt from its kwargs, the window's start and the
deadline among them), and when it ends the run's own teardowns delete the endpoint and its slice and the run's
ledger closes with the reason, as for any other run. The run stays running while the endpoint is kept; the
reaper still leaves what is kept.

Every kept endpoint has an absolute lifetime: ``max_lifetime_hours``, at most the admin's Variable
``tpuflow_max_kept_endpoint_hours`` (24 h when unset). Idle is judged only from the application's
successful answers (tpuflow.serve.idle), so callers the endpoint refuses cannot keep it, and the lifetime
bounds what its accepted callers can.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.deprecations import warn_renamed_keyword
from tpuflow.errors import UserInputError
from tpuflow.limits import DEFAULT_MAX_KEPT_ENDPOINT_HOURS, MAX_KEPT_ENDPOINT_VARIABLE, check_limit
from tpuflow.ray.cluster_source import cluster_source_task, trusted_cluster
from tpuflow.ray.connection import check_cluster
from tpuflow.serve.idle import IdleWatch, poll_interval_for, serve_activity
from tpuflow.serve.metrics_read import METRICS_TIMEOUT_S, ServeMetricsReader
from tpuflow.templating import is_true
from tpuflow.validation import check_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.serve.hooks import RayServeHook

NOT_KEPT = "not kept: keep_endpoint is off, or the endpoint never answered"


def idle_minutes(value: Any) -> float | None:
    """``idle_timeout_minutes`` as minutes: None (or "", 0) for never; a bad value is one line naming the field."""
    if value in (None, "", "None"):
        return None
    try:
        minutes = float(value)
    except (TypeError, ValueError):
        minutes = -1.0
    if minutes < 0 or minutes != minutes:
        raise UserInputError(
            "idle_timeout_minutes",
            value,
            "give the minutes without a request after which a kept endpoint stops (0: only its lifetime)",
        )
    return minutes or None


# one Variable for the admin's kept lifetime: it also bounds the kept serve pool's GKE deadline (tpuflow.limits)
LIFETIME_VARIABLE = MAX_KEPT_ENDPOINT_VARIABLE
DEFAULT_LIFETIME_HOURS = DEFAULT_MAX_KEPT_ENDPOINT_HOURS
_UNSET = (None, "", "None")


def _positive_hours(field: str, value: Any, fix: str) -> float:
    try:
        hours = float(value) if not isinstance(value, bool) else -1.0
    except (TypeError, ValueError):
        hours = -1.0
    if not (hours > 0 and math.isfinite(hours)):
        raise UserInputError(field, value, fix)
    return hours


def lifetime_ceiling(variable: Any) -> float:
    """The admin's most hours a kept endpoint lives: the Variable's value, or 24 h where it is unset."""
    return DEFAULT_LIFETIME_HOURS if variable in _UNSET else check_limit(LIFETIME_VARIABLE, variable, "hours")


def lifetime_hours(argument: Any, ceiling: float) -> float:
    """The kept endpoint's lifetime: ``max_lifetime_hours`` (unset: the ceiling), never above the ceiling."""
    if argument in _UNSET:
        return ceiling
    hours = _positive_hours(
        "max_lifetime_hours",
        argument,
        f"give the most hours the kept endpoint serves (a positive finite number; the Variable {LIFETIME_VARIABLE} "
        "caps it), or leave it unset for the Variable's",
    )
    return min(hours, ceiling)


class RayServeWaitForIdleOperator(ArgumentChecks, BaseOperator):
    """Decide whether the run's teardowns keep its endpoint, and while kept, wait until it is idle or has lived
    its lifetime.

    Returns ``{"keep": bool, "reason", ...}``; the teardowns keep the endpoint (and its slice) only when
    ``keep`` is true. Not kept (``keep`` renders false): returns at once. Kept: defers until the endpoint's
    lifetime ends (``max_lifetime_hours``, capped by the admin's Variable ``tpuflow_max_kept_endpoint_hours``,
    24 h when unset; Airflow's DateTimeTrigger when there is no ``idle_timeout_minutes``), or with
    ``idle_timeout_minutes``, on
    RayServeIdleTrigger until sooner Serve's proxy has given no successful answer (HTTP 2xx, gRPC OK; health
    checks aside) for that many minutes; then returns ``keep: False, stopped: "idle" | "lifetime"`` with the
    reason, the idle seconds, the count and when it last answered. Refused requests (401, 404, 5xx) are no
    activity, and requests held in flight defer the stop by at most one window. Metrics that cannot be read for
    ``unreadable_after`` seconds fail the task, and the teardowns (which then find no ``keep``) delete the
    endpoint: a watch that cannot see it cannot vouch for it. The metrics are read without the cluster's token
    (Ray's exporter takes none), at most ``metrics_timeout`` seconds and 32 MiB a read.

    :param cluster: templated; where the endpoint's cluster is: an XCom with ``metrics_url`` (the local
        cluster's start task, a RayService deploy).
    :param keep: templated; whether the endpoint is to be kept at all (keep_endpoint and it answered).
    :param idle_timeout_minutes: templated; minutes without a successful answer after which the kept endpoint
        goes; None / 0: only its lifetime ends it. (``idle_timeout``, its name before, is still accepted for one
        release, with a deprecation warning.)
    :param max_lifetime_hours: templated; hours after which the kept endpoint goes however busy it is; None: the
        Variable ``tpuflow_max_kept_endpoint_hours`` (24 when unset), which also caps a larger value.
    :param ray_conn_id: Airflow connection naming the cluster (extra ``metrics_url``), when ``cluster`` does not.
    :param poll_interval: seconds between metric reads; default a tenth of the window, 5 to 60 s.
    :param margin: seconds added to the window for Ray's metric export delay.
    :param unreadable_after: seconds of unreadable metrics that end the watch as failed.
    :param metrics_timeout: seconds of wall clock one read of the metrics may take (then it counts as unreadable).
    :param deferrable: wait in the triggerer (default); False: in the worker, with the same wait.
    """

    template_fields: Sequence[str] = ("cluster", "keep", "idle_timeout_minutes", "max_lifetime_hours")
    ui_color = "#e2f0d9"

    def __init__(
        self,
        *,
        cluster: Any = None,
        keep: Any = False,
        idle_timeout_minutes: Any = None,
        max_lifetime_hours: Any = None,
        ray_conn_id: str | None = None,
        poll_interval: float | None = None,
        margin: float = 30.0,
        unreadable_after: float = 600.0,
        metrics_timeout: float = METRICS_TIMEOUT_S,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        if "idle_timeout" in kwargs:  # its name before it carried its unit
            if idle_timeout_minutes is not None:
                raise UserInputError(
                    "idle_timeout",
                    kwargs["idle_timeout"],
                    "give idle_timeout_minutes only (idle_timeout is its old name)",
                )
            warn_renamed_keyword(type(self).__name__, "idle_timeout", "idle_timeout_minutes")
            idle_timeout_minutes = kwargs.pop("idle_timeout")
        super().__init__(**kwargs)
        self.cluster = cluster
        self._cluster_source = cluster_source_task(cluster)  # whose XCom it is: where and how come from that task
        self.keep = keep
        self.idle_timeout_minutes = idle_timeout_minutes
        self.max_lifetime_hours = max_lifetime_hours
        self.ray_conn_id = ray_conn_id
        self.poll_interval = poll_interval
        self.margin = margin
        self.unreadable_after = unreadable_after
        self.metrics_timeout = metrics_timeout
        self.deferrable = deferrable

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.idle_timeout_minutes,), lambda: idle_minutes(self.idle_timeout_minutes)),
            ((self.max_lifetime_hours,), lambda: lifetime_hours(self.max_lifetime_hours, math.inf)),
            ((), self._check_waiting),
        ]

    def _check_waiting(self) -> None:
        if self.poll_interval is not None:
            check_seconds("poll_interval", self.poll_interval)
        check_seconds("margin", self.margin, allow_zero=True)
        check_seconds("unreadable_after", self.unreadable_after)
        check_seconds("metrics_timeout", self.metrics_timeout)

    def hook(self) -> RayServeHook:
        from tpuflow.serve.hooks import RayServeHook

        return RayServeHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster or None)

    def lifetime(self) -> float:
        """Hours the kept endpoint may serve: the argument, at most the admin's Variable (24 h when unset)."""
        from airflow.sdk import Variable

        ceiling = lifetime_ceiling(Variable.get(LIFETIME_VARIABLE, default=None))
        hours = lifetime_hours(self.max_lifetime_hours, ceiling)
        if self.max_lifetime_hours not in _UNSET and hours < lifetime_hours(self.max_lifetime_hours, math.inf):
            self.log.warning(
                "max_lifetime_hours=%s is above the admin's ceiling: the endpoint is kept at most %g h (Variable %s)",
                self.max_lifetime_hours,
                hours,
                LIFETIME_VARIABLE,
            )
        return hours

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate_arguments()
        if not is_true(self.keep):
            return {"keep": False, "reason": NOT_KEPT}
        self.cluster = trusted_cluster(self, self.cluster, self._cluster_source, context)
        minutes = idle_minutes(self.idle_timeout_minutes)
        hours = self.lifetime()
        kept_since = time.time()
        deadline = kept_since + hours * 3600
        if minutes is None:
            self.log.info(
                "keep_endpoint without idle_timeout_minutes: the endpoint serves for its lifetime, %g h", hours
            )
            return self._wait_for_lifetime(context, deadline, hours)
        check_cluster(self.cluster, self.ray_conn_id)
        url = self.hook().metrics_url
        window = minutes * 60
        wait = {
            "idle_timeout_s": window,
            "since": kept_since,
            "requests": serve_activity(asyncio.run(self._reader(url).aread_metrics())).requests,
            "poll_interval": self.poll_interval or poll_interval_for(window),
            "margin": self.margin,
            "unreadable_after": self.unreadable_after,
            "deadline": deadline,
            "metrics_timeout": self.metrics_timeout,
        }
        self.log.info(
            "Keeping the endpoint %s while it serves: it goes after %g min without a successful answer, or after "
            "%g h however busy (Serve's count of successful answers at %s: %g now)",
            (self.cluster or {}).get("serve_url", "") if isinstance(self.cluster, dict) else "",
            minutes,
            hours,
            url,
            wait["requests"],
        )
        if self.deferrable:
            self.execute_async(context, wait, hours)
        return self.execute_sync(context, wait, hours)

    def _reader(self, url: str) -> ServeMetricsReader:
        return ServeMetricsReader(url, timeout=self.metrics_timeout)

    def _wait_for_lifetime(self, context: Context, deadline: float, hours: float) -> dict[str, Any]:
        """Kept without idle_timeout_minutes: wait (deferred on Airflow's DateTimeTrigger) until the lifetime ends."""
        if self.deferrable:
            from airflow.providers.standard.triggers.temporal import DateTimeTrigger

            self.defer(
                trigger=DateTimeTrigger(moment=datetime.fromtimestamp(deadline, tz=UTC)),
                method_name="execute_complete",
                kwargs={"max_lifetime_h": hours, "deadline": deadline},
            )
        time.sleep(max(0.0, deadline - time.time()))
        return self.execute_complete(context, None, max_lifetime_h=hours, deadline=deadline)

    def execute_async(self, context: Context, wait: dict[str, Any], hours: float) -> None:
        """Defer: RayServeIdleTrigger reads the metrics in the triggerer; nothing holds a worker meanwhile."""
        from tpuflow.serve.triggers import RayServeIdleTrigger

        self.defer(
            trigger=RayServeIdleTrigger(cluster=self.cluster or None, ray_conn_id=self.ray_conn_id, **wait),
            method_name="execute_complete",
            kwargs={"max_lifetime_h": hours, "deadline": wait["deadline"]},
        )

    def execute_sync(self, context: Context, wait: dict[str, Any], hours: float) -> dict[str, Any]:
        """Wait in this worker: the trigger's own wait, run here."""
        from tpuflow.serve.waits import wait_until_idle

        watch = IdleWatch(wait["idle_timeout_s"], wait["since"], wait["requests"], wait["margin"], wait["deadline"])
        event = asyncio.run(
            wait_until_idle(
                self._reader(self.hook().metrics_url),
                watch,
                poll_interval=wait["poll_interval"],
                unreadable_after=wait["unreadable_after"],
                log=self.log,
            )
        )
        return self.execute_complete(context, event, max_lifetime_h=hours, deadline=wait["deadline"])

    def execute_complete(
        self, context: Context, event: Any, max_lifetime_h: float | None = None, deadline: float | None = None
    ) -> dict[str, Any]:
        """The verdict, for both paths: RayServeIdleTrigger's event, DateTimeTrigger's (the lifetime ended; not
        a dict), or the same from the worker's wait."""
        from airflow.sdk.exceptions import AirflowException

        event = event if isinstance(event, dict) else {"status": "success", "stopped": "lifetime"}
        if event.get("status") != "success":
            raise AirflowException(f"Stopped watching the kept endpoint: {event.get('message')}; it is torn down")
        minutes = idle_minutes(self.idle_timeout_minutes)
        stopped = event.get("stopped") or "idle"
        if stopped == "lifetime":
            reason = (
                f"lifetime: kept {max_lifetime_h or 0:g} h, the most it may serve (max_lifetime_hours, at most the "
                f"Variable {LIFETIME_VARIABLE})"
            )
        else:
            reason = f"idle: no successful answer for {minutes or 0:g} min (idle_timeout_minutes)"
        self.log.info("Stopping the kept endpoint, %s; the teardowns delete it and its slice", reason)
        return {
            "keep": False,
            "stopped": stopped,
            "idle_timeout_min": minutes,
            "max_lifetime_h": max_lifetime_h,
            "idle_s": event.get("idle_s"),
            "requests": event.get("requests"),
            "last_busy_at": event.get("since"),
            "deadline": deadline,
            "stopped_at": time.time(),
            "reason": reason,
        }
