"""Deferral triggers: wait for a RayCluster/RayService to be ready, or for one to be gone.

They live in the installed package (never beside DAG files) so the triggerer can import them; their
kwargs are plain JSON (the Kubernetes target as KubeTarget.to_dict(), the deadline as epoch seconds).
The polling itself is `operators.kuberay.waits`, shared with the non-deferrable path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from operators.kuberay.hooks import AsyncKubeRayHook, KubeTarget
from operators.kuberay.waits import wait_gone, wait_ready


class KubeRayReadyTrigger(BaseTrigger):
    """Fires once with {"status": "ready" | "failed" | "timeout" | "error", "message", "diagnostics", ...}."""

    def __init__(self, *, kind: str, name: str, namespace: str, target: dict[str, Any], deadline: float,
                 poll_interval: float = 10.0, log_lines: int = 50) -> None:
        super().__init__()
        self.kind, self.name, self.namespace = kind, name, namespace
        self.target, self.deadline = dict(target), float(deadline)
        self.poll_interval, self.log_lines = float(poll_interval), int(log_lines)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "kind": self.kind, "name": self.name, "namespace": self.namespace, "target": self.target,
            "deadline": self.deadline, "poll_interval": self.poll_interval, "log_lines": self.log_lines,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        reader = AsyncKubeRayHook(KubeTarget.from_dict(self.target))
        try:
            event = await wait_ready(reader, kind=self.kind, name=self.name, namespace=self.namespace,
                                     deadline=self.deadline, poll_interval=self.poll_interval,
                                     log_lines=self.log_lines)
        except Exception as err:  # report, so execute_complete raises with the cause
            event = {"status": "error", "kind": self.kind, "name": self.name, "namespace": self.namespace,
                     "message": f"waiting for {self.kind} {self.namespace}/{self.name} failed: "
                                f"{type(err).__name__}: {err}", "diagnostics": ""}
        yield TriggerEvent(event)


class KubeRayDeletedTrigger(BaseTrigger):
    """Fires once with {"status": "deleted" | "timeout" | "error", "message", ...}."""

    def __init__(self, *, kind: str, name: str, namespace: str, target: dict[str, Any], deadline: float,
                 poll_interval: float = 5.0) -> None:
        super().__init__()
        self.kind, self.name, self.namespace = kind, name, namespace
        self.target, self.deadline, self.poll_interval = dict(target), float(deadline), float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "kind": self.kind, "name": self.name, "namespace": self.namespace, "target": self.target,
            "deadline": self.deadline, "poll_interval": self.poll_interval,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        reader = AsyncKubeRayHook(KubeTarget.from_dict(self.target))
        try:
            event = await wait_gone(reader, kind=self.kind, name=self.name, namespace=self.namespace,
                                    deadline=self.deadline, poll_interval=self.poll_interval)
        except Exception as err:
            event = {"status": "error", "kind": self.kind, "name": self.name, "namespace": self.namespace,
                     "message": f"waiting for {self.kind} {self.namespace}/{self.name} to be deleted failed: "
                                f"{type(err).__name__}: {err}", "diagnostics": ""}
        yield TriggerEvent(event)
