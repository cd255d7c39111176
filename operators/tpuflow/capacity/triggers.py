"""Waiting for TPU capacity: a ProvisioningRequest to be Provisioned, a flex-start pool to grow for its pods.

One coroutine per wait (``wait_provisioned``, ``wait_flex_start``), run by the triggers here in the
triggerer or by ``asyncio.run`` in the non-deferrable path, over a reader with the async reads of
tpuflow.capacity.hooks (``AsyncCapacityHook``, or ``SyncCapacityReader`` over the sync hook).
Both fire the tpuflow.events shape; a failure or timeout carries GKE's own reason (the
ProvisioningRequest's condition, or the cluster autoscaler's event on the pending pods).
Trigger kwargs are plain JSON (the target as KubeTarget.to_dict(), times as epoch seconds).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from airflow.triggers.base import TriggerEvent

from tpuflow.capacity.provisioning_request import request_verdict
from tpuflow.events import make_event
from tpuflow.kubernetes.errors import is_transient
from tpuflow.polling import poll_delays
from tpuflow.triggers import TpuflowTrigger

AUTOSCALER_REASONS = ("NotTriggerScaleUp", "FailedScaleUp", "TriggeredScaleUp", "ScaleUpTimedOut")


class CapacityReader(Protocol):
    async def get_provisioning_request(self, name: str, namespace: str) -> dict[str, Any] | None: ...

    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    async def events_for(self, namespace: str, names: list[str]) -> list[dict[str, Any]]: ...


async def wait_provisioned(
    reader: CapacityReader,
    *,
    name: str,
    namespace: str,
    deadline: float,
    poll_interval: float,
    started_at: float,
    log: Any,
) -> dict[str, Any]:
    """Poll until ``Provisioned=True`` (success), a final condition (failed, GKE's reason) or the deadline."""
    what = f"ProvisioningRequest {namespace}/{name}"
    reason, last_error = "not read yet", ""
    delays = poll_delays(poll_interval)
    while True:
        try:
            verdict = request_verdict(await reader.get_provisioning_request(name, namespace))
            reason, last_error = verdict.reason, ""
        except Exception as err:
            if not is_transient(err):
                return make_event("error", f"reading {what} failed: {type(err).__name__}: {err}", name=name)
            verdict, last_error = None, f"{type(err).__name__}: {err}"
        elapsed = time.time() - started_at
        if verdict is not None and verdict.state == "provisioned":
            return make_event("success", f"{what} is provisioned after {elapsed:.0f} s ({reason})", name=name)
        if verdict is not None and verdict.state == "failed":
            # Capacity may come back: a retry asks again (a request GKE refused as invalid would not do better).
            retryable = "InvalidParameters" not in reason
            return make_event("failed", f"{what}: {reason}", name=name, retryable=retryable)
        remaining = deadline - time.time()
        if remaining <= 0:
            note = f" (last API error: {last_error})" if last_error else ""
            return make_event(
                "timeout", f"{what} not provisioned after {elapsed:.0f} s, by the deadline: {reason}{note}", name=name
            )
        log.info("Waiting for queued capacity: %s, %.0f s so far: %s", what, elapsed, reason)
        await asyncio.sleep(min(next(delays), max(remaining, 0.01)))


def _scheduled(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded"):
        return True
    return any(c.get("type") == "PodScheduled" and c.get("status") == "True" for c in status.get("conditions") or [])


def _autoscaler_news(events: Sequence[Mapping[str, Any]]) -> str:
    """The newest word of the cluster autoscaler on the pods (e.g. NotTriggerScaleUp with the stockout)."""
    mine = [e for e in events if e.get("reason") in AUTOSCALER_REASONS]
    if not mine:
        return ""
    newest = max(mine, key=lambda e: (str(e.get("lastTimestamp") or ""), int(e.get("count") or 0)))
    return f"{newest.get('reason')}: {newest.get('message', '')}"


async def wait_flex_start(
    reader: CapacityReader,
    *,
    namespace: str,
    label_selector: str,
    expected_pods: int,
    deadline: float,
    poll_interval: float,
    started_at: float,
    log: Any,
) -> dict[str, Any]:
    """Poll the TPU pods until all ``expected_pods`` are scheduled (the pool grew), or the deadline."""
    news, last_error, scheduled, count = "", "", 0, 0
    delays = poll_delays(poll_interval)
    while True:
        try:
            pods = await reader.pods(namespace, label_selector)
            count, scheduled = len(pods), sum(1 for p in pods if _scheduled(p))
            pending = [p["metadata"]["name"] for p in pods if not _scheduled(p)]
            news = _autoscaler_news(await reader.events_for(namespace, pending)) if pending else news
            last_error = ""
        except Exception as err:
            if not is_transient(err):
                return make_event("error", f"reading pods {label_selector} failed: {type(err).__name__}: {err}")
            last_error = f"{type(err).__name__}: {err}"
        elapsed = time.time() - started_at
        if count >= expected_pods and scheduled >= expected_pods:
            return make_event(
                "success", f"flex-start capacity arrived after {elapsed:.0f} s: {scheduled} TPU pod(s) scheduled"
            )
        remaining = deadline - time.time()
        status = f"{scheduled}/{expected_pods} TPU pod(s) scheduled"
        if remaining <= 0:
            why = news or (f"last API error: {last_error}" if last_error else "the autoscaler said nothing")
            return make_event(
                "timeout", f"no flex-start capacity after {elapsed:.0f} s ({status}): {why}", pods=label_selector
            )
        log.info("waiting for flex-start capacity: %s, %.0f s elapsed%s", status, elapsed, f" ({news})" if news else "")
        await asyncio.sleep(min(next(delays), max(remaining, 0.01)))


class _CapacityTrigger(TpuflowTrigger):
    def hook(self) -> Any:
        from tpuflow.capacity.hooks import AsyncCapacityHook
        from tpuflow.kubernetes.hooks import KubeTarget

        return AsyncCapacityHook.for_target(KubeTarget.from_dict(self.target))  # type: ignore[attr-defined]


class ProvisioningRequestTrigger(_CapacityTrigger):
    """Fires once wait_provisioned's event (with ``name``), carrying ``plan`` back to the operator (the
    event, not next_kwargs: ``dag.test()`` replaces those with the event)."""

    serialize_fields = ("name", "namespace", "target", "deadline", "poll_interval", "started_at", "plan")

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        target: dict[str, Any],
        deadline: float,
        poll_interval: float,
        started_at: float,
        plan: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.name, self.namespace, self.target = name, namespace, dict(target)
        self.deadline, self.poll_interval, self.started_at = float(deadline), float(poll_interval), float(started_at)
        self.plan = dict(plan or {})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        event = await wait_provisioned(
            self.hook(),
            name=self.name,
            namespace=self.namespace,
            deadline=self.deadline,
            poll_interval=self.poll_interval,
            started_at=self.started_at,
            log=self.log,
        )
        yield TriggerEvent({**event, "plan": self.plan})

    async def on_kill(self) -> None:
        """The user marked the deferred task failed/success or cleared it: withdraw the request it made
        (``cleanup()`` is not overridden: it also runs on triggerer restarts)."""
        hook = self.hook()
        try:
            await hook.delete_provisioning_request(self.name, self.namespace)
            for template in self.plan.get("pod_templates") or []:
                await hook.delete_pod_template(template, self.namespace)
            self.log.warning("Task killed: deleted ProvisioningRequest %s/%s", self.namespace, self.name)
        except Exception:
            self.log.exception("Task killed, but deleting ProvisioningRequest %s/%s failed", self.namespace, self.name)


class FlexStartCapacityTrigger(_CapacityTrigger):
    """Fires once wait_flex_start's event."""

    serialize_fields = (
        "namespace",
        "label_selector",
        "expected_pods",
        "target",
        "deadline",
        "poll_interval",
        "started_at",
    )

    def __init__(
        self,
        *,
        namespace: str,
        label_selector: str,
        expected_pods: int,
        target: dict[str, Any],
        deadline: float,
        poll_interval: float,
        started_at: float,
    ) -> None:
        super().__init__()
        self.namespace, self.label_selector, self.expected_pods = namespace, label_selector, int(expected_pods)
        self.target = dict(target)
        self.deadline, self.poll_interval, self.started_at = float(deadline), float(poll_interval), float(started_at)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        event = await wait_flex_start(
            self.hook(),
            namespace=self.namespace,
            label_selector=self.label_selector,
            expected_pods=self.expected_pods,
            deadline=self.deadline,
            poll_interval=self.poll_interval,
            started_at=self.started_at,
            log=self.log,
        )
        yield TriggerEvent(event)
