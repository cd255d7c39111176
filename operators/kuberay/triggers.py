"""Deferral triggers: wait for a RayCluster/RayService to be ready, or for one to be gone.

They live in the installed package (never beside DAG files) so the triggerer can import them; their
kwargs are plain JSON (the Kubernetes target as KubeTarget.to_dict(), the deadline as epoch seconds).
The polling itself is `tpuflow.kuberay.waits`, shared with the non-deferrable path.

Kill semantics: a user marking a deferred create/deploy task failed/success or clearing it makes the
triggerer call ``KubeRayReadyTrigger.on_kill``, which deletes the object the task owns (the one
carrying its run-key label). ``cleanup()`` is not overridden: it also runs on triggerer restarts.
``KubeRayDeletedTrigger`` waits for a deletion already requested: killing it deletes nothing more.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from tpuflow.kuberay import RUN_KEY_LABEL
from tpuflow.kuberay.hooks import AsyncKubeRayHook, KubeTarget
from tpuflow.kuberay.waits import KINDS, wait_gone, wait_ready


def owned_by(obj: Mapping[str, Any] | None, run_key: str | None) -> bool:
    """Whether a RayCluster/RayService was created by the task instance with this run key."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return bool(run_key) and labels.get(RUN_KEY_LABEL) == run_key


class KubeRayReadyTrigger(BaseTrigger):
    """Fires once with {"status": "ready" | "failed" | "timeout" | "error", "message", "diagnostics", ...}."""

    def __init__(self, *, kind: str, name: str, namespace: str, target: dict[str, Any], deadline: float,
                 poll_interval: float = 10.0, log_lines: int = 50, owner_run_key: str | None = None) -> None:
        super().__init__()
        self.kind, self.name, self.namespace = kind, name, namespace
        self.target, self.deadline = dict(target), float(deadline)
        self.poll_interval, self.log_lines = float(poll_interval), int(log_lines)
        self.owner_run_key = owner_run_key  # None (serialized before it existed): on_kill deletes nothing

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "kind": self.kind, "name": self.name, "namespace": self.namespace, "target": self.target,
            "deadline": self.deadline, "poll_interval": self.poll_interval, "log_lines": self.log_lines,
            "owner_run_key": self.owner_run_key,
        })

    async def on_kill(self) -> None:
        """The user marked the deferred task failed/success or cleared it: delete what it created.

        Only an object labelled with this task's run key: a RayService the task merely updated (a stable
        name first deployed by another run) is left serving.
        """
        if not self.owner_run_key:
            return
        hook = AsyncKubeRayHook(KubeTarget.from_dict(self.target))
        plural = KINDS[self.kind]
        obj = await hook.get(plural, self.name, self.namespace)
        if obj is None:
            return
        if not owned_by(obj, self.owner_run_key):
            self.log.info("Task killed; %s %s/%s was not created by it, leaving it", self.kind, self.namespace,
                          self.name)
            return
        self.log.warning("Task killed: deleting %s %s/%s", self.kind, self.namespace, self.name)
        await hook.delete(plural, self.name, self.namespace)

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
