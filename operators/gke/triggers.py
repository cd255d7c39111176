"""Deferral triggers for the node pool operators.

``GKENodePoolOperationTrigger`` is the google provider's GKEOperationTrigger (poll until DONE) with
our async hook, which honours the connection's endpoint/transport extras. The provider's trigger
reports success on DONE without looking at ``operation.error``; the operator's execute_complete
fetches the finished operation and checks it.

Both triggers hand the operator's progress back in the event (``resume``) instead of relying on
the deferral's next_kwargs: ``dag.test()`` in Airflow 3.3 replaces next_kwargs with the event, so
state passed only there is lost in tests and local runs. Trigger kwargs are plain JSON values.

Kill semantics: when a user marks the deferred create task failed/success or clears it, the
triggerer calls ``on_kill``, which deletes the node pools the task owns (``delete_on_kill``: the
plan's pool names and the task's ``tpuflow-key`` label; pools with another owner are left alone).
A pool whose create is still running cannot be deleted until that create ends, so the deletion
waits for it: within ``[triggerer] on_kill_timeout`` when it can, then on in the triggerer's event
loop (lost if the triggerer restarts first; the log names the pools). ``cleanup()`` is not
overridden: it also runs on triggerer restarts, where nothing may be deleted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEOperationTrigger
from airflow.triggers.base import BaseTrigger, TriggerEvent
from tpuflow.gke.hooks import GKENodePoolAsyncHook

# Deletions still waiting for a create when on_kill had to return (a task nobody references can be
# garbage collected mid-flight).
_KILLS: set[asyncio.Task[None]] = set()
_KILL_PATIENCE_S = 2 * 3600.0  # a TPU pool create takes minutes; give up (and say so) after this


async def _delete_when_possible(owned: dict[str, Any], log: Any) -> None:
    from tpuflow.gke.provisioning import kill_owned_pools

    try:
        hook = GKENodePoolAsyncHook(
            gcp_conn_id=owned.get("gcp_conn_id") or "google_cloud_default",
            location=owned["location"],
            impersonation_chain=owned.get("impersonation_chain"),
        )
        sync_hook = await hook.get_sync_hook()
        interval = min(float(owned.get("poll_interval") or 5.0), 5.0)
        give_up = time.monotonic() + _KILL_PATIENCE_S
        names = list(owned["node_pool_names"])
        while names:
            names = await asyncio.to_thread(kill_owned_pools, sync_hook, {**owned, "node_pool_names": names})
            if names and time.monotonic() > give_up:
                log.error("Task killed, but GKE is still busy with node pool(s) %s after %.0f s; delete them by "
                          "hand (label tpuflow-key=%s)", names, _KILL_PATIENCE_S, owned.get("owner_key"))
                return
            if names:
                log.info("Task killed: GKE is still creating node pool(s) %s; deleting once that ends", names)
                await asyncio.sleep(interval)
    except Exception:
        log.exception("Task killed, but deleting its node pools %s failed", owned.get("node_pool_names"))


async def delete_owned_node_pools(owned: dict[str, Any], log: Any) -> None:
    """on_kill of the create task's waits: delete its pools, waiting out creates still running."""
    from airflow.sdk import conf

    task = asyncio.ensure_future(_delete_when_possible(owned, log))
    _KILLS.add(task)
    task.add_done_callback(_KILLS.discard)
    budget = 0.8 * conf.getfloat("triggerer", "on_kill_timeout", fallback=30.0)
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=budget)
    except TimeoutError:
        log.warning("Node pool(s) %s are still being created; they are deleted when GKE allows it, from this "
                    "triggerer's event loop", owned.get("node_pool_names"))


class GKENodePoolOperationTrigger(GKEOperationTrigger):
    def __init__(
        self,
        *args: Any,
        resume: dict[str, Any] | None = None,
        delete_on_kill: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.resume = resume or {}
        self.delete_on_kill = delete_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            **kwargs, "resume": self.resume, "delete_on_kill": self.delete_on_kill,
        }

    async def on_kill(self) -> None:
        """The user marked the deferred task failed/success or cleared it: delete the pools it owns."""
        if self.delete_on_kill:
            await delete_owned_node_pools(self.delete_on_kill, self.log)

    def _get_hook(self) -> GKENodePoolAsyncHook:  # type: ignore[override]
        if self._hook is None:
            self._hook = GKENodePoolAsyncHook(
                gcp_conn_id=self.gcp_conn_id,
                location=self.location,
                impersonation_chain=self.impersonation_chain,
            )
        return self._hook

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for event in super().run():
            yield TriggerEvent({**event.payload, "resume": self.resume})


class NodePoolBackoffTrigger(BaseTrigger):
    """Wait until ``wake_at`` (unix time, so a triggerer restart does not lengthen the wait)."""

    def __init__(
        self,
        wake_at: float,
        reason: str = "",
        resume: dict[str, Any] | None = None,
        delete_on_kill: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.wake_at = float(wake_at)
        self.reason = reason
        self.resume = resume or {}
        self.delete_on_kill = delete_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"wake_at": self.wake_at, "reason": self.reason, "resume": self.resume,
             "delete_on_kill": self.delete_on_kill},
        )

    async def on_kill(self) -> None:
        """Killed during a backoff (e.g. after a stockout): delete the pools the create task made so far."""
        if self.delete_on_kill:
            await delete_owned_node_pools(self.delete_on_kill, self.log)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await asyncio.sleep(max(0.0, self.wake_at - time.time()))
        yield TriggerEvent({"status": "success", "message": f"waited: {self.reason}", "resume": self.resume})
