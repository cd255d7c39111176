"""Deferral triggers: wait for a RayCluster/RayService to be ready, or for one to be gone.

They live in the installed package (never beside DAG files) so the triggerer can import them; they
are ``TpuflowTrigger``s (plain-JSON kwargs: the kind by its name, resolved with
tpuflow.kuberay.kinds.kind_named; the Kubernetes target as KubeTarget.to_dict(); the deadline as epoch
seconds) and fire the ``tpuflow.events`` shape (``KubeRayEvent``). The polling
itself is `tpuflow.kuberay.waits`, shared with the non-deferrable path.

Kill semantics: a user marking a deferred create/deploy task failed/success or clearing it makes the
triggerer call ``KubeRayReadyTrigger.on_kill``, which deletes the object the task owns (the one
carrying its run-key label). ``cleanup()`` is not overridden: it also runs on triggerer restarts.
``KubeRayDeletedTrigger`` waits for a deletion already requested: killing it deletes nothing more.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any, ClassVar

from airflow.triggers.base import TriggerEvent

from tpuflow.kuberay import RUN_KEY_LABEL
from tpuflow.kuberay.hooks import AsyncKubeRayHook
from tpuflow.kuberay.kinds import kind_named
from tpuflow.kuberay.waits import KubeRayEvent, kuberay_event, wait_gone, wait_ready
from tpuflow.kubernetes.hooks import KubeTarget
from tpuflow.triggers import TpuflowTrigger


def owned_by(obj: Mapping[str, Any] | None, run_key: str | None) -> bool:
    """Whether a RayCluster/RayService was created by the task instance with this run key."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return bool(run_key) and labels.get(RUN_KEY_LABEL) == run_key


class _KubeRayTrigger(TpuflowTrigger):
    """One KubeRay object (kind, name, namespace) on one Kubernetes target, until a deadline."""

    serialize_fields: ClassVar[tuple[str, ...]] = ("kind", "name", "namespace", "target", "deadline", "poll_interval")
    waiting_for = "to be ready"

    def __init__(
        self,
        *,
        kind: str,
        name: str,
        namespace: str,
        target: dict[str, Any],
        deadline: float,
        poll_interval: float = 10.0,
    ) -> None:
        super().__init__()
        self.kind, self.name, self.namespace = kind, name, namespace
        self.target, self.deadline, self.poll_interval = dict(target), float(deadline), float(poll_interval)

    def waited_for(self) -> dict[str, Any]:
        """The wait coroutine's arguments: the object, the deadline and the poll interval."""
        return {
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "deadline": self.deadline,
            "poll_interval": self.poll_interval,
        }

    def hook(self) -> AsyncKubeRayHook:
        return AsyncKubeRayHook.for_target(KubeTarget.from_dict(self.target))

    @abc.abstractmethod
    def wait(self) -> Awaitable[KubeRayEvent]: ...

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            event = await self.wait()
        except Exception as err:  # report, so execute_complete raises with the cause
            event = kuberay_event(
                "error",
                self.kind,
                self.name,
                self.namespace,
                f"waiting for {self.kind} {self.namespace}/{self.name} {self.waiting_for} failed: "
                f"{type(err).__name__}: {err}",
            )
        yield await self.event(event)


class KubeRayReadyTrigger(_KubeRayTrigger):
    """Fires once a KubeRayEvent: success (ready), failed (KubeRay reports a failure), timeout or error.

    ``owner_run_key``: the run-key label of the task that created the object; killing the task deletes
    the object only if it carries it (None: on_kill deletes nothing).
    """

    serialize_fields = (*_KubeRayTrigger.serialize_fields, "log_lines", "owner_run_key")

    def __init__(self, *, log_lines: int = 50, owner_run_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log_lines = int(log_lines)
        self.owner_run_key = owner_run_key

    def wait(self) -> Awaitable[KubeRayEvent]:
        return wait_ready(self.hook(), **self.waited_for(), log_lines=self.log_lines)

    async def on_kill(self) -> None:
        """The user marked the deferred task failed/success or cleared it: delete what it created.

        Only an object labelled with this task's run key: a RayService the task merely updated (a stable
        name first deployed by another run) is left serving.
        """
        if not self.owner_run_key:
            return
        hook = self.hook()
        kind = kind_named(self.kind)
        plural = kind.plural
        obj = await hook.get(plural, self.name, self.namespace)
        if obj is None:
            return
        if not owned_by(obj, self.owner_run_key):
            self.log.info(
                "Task killed; %s %s/%s was not created by it, leaving it", self.kind, self.namespace, self.name
            )
            return
        self.log.warning("Task killed: deleting %s %s/%s", self.kind, self.namespace, self.name)
        await hook.delete(plural, self.name, self.namespace, foreground=kind.delete_foreground)


class KubeRayDeletedTrigger(_KubeRayTrigger):
    """Fires once a KubeRayEvent: success (the object is gone), timeout or error.

    :param end_task: ``{"xcoms": {...}}``: once the object is gone, end the task here with these XComs
        (``tpuflow.triggers``); None: the task resumes on a worker.
    :param clusters: the RayClusters KubeRay made for the object, read before its delete (``wait_gone``).
    """

    serialize_fields = (*_KubeRayTrigger.serialize_fields, "end_task", "clusters")
    waiting_for = "to be deleted"

    def __init__(self, *, end_task: dict[str, Any] | None = None, clusters: Sequence[str] = (), **wait: Any) -> None:
        super().__init__(**wait)
        self.end_task = end_task
        self.clusters = list(clusters)

    def wait(self) -> Awaitable[KubeRayEvent]:
        return wait_gone(self.hook(), **self.waited_for(), clusters=self.clusters)
