"""Deferral triggers for the node pool operators (tpuflow.triggers.TpuflowTrigger; tpuflow.events shape).

``GKENodePoolOperationTrigger`` polls a GKE operation until DONE (or its ``operation_timeout``), like the google provider's
GKEOperationTrigger, through our async hook, which honours the connection's endpoint/transport
extras. It reports success on DONE without looking at ``operation.error``; the operator's
execute_complete fetches the finished operation and checks it. The waits themselves are the
coroutines of tpuflow.gke.waits, which the non-deferrable path runs with asyncio.run.

Both triggers hand the operator's progress back in the event (``resume``) instead of relying on
the deferral's next_kwargs: ``dag.test()`` in Airflow 3.3 replaces next_kwargs with the event, so
state passed only there is lost in tests and local runs. Trigger kwargs are plain JSON values.

Kill semantics: when a user marks the deferred create task failed/success or clears it, the
triggerer calls ``on_kill``, which deletes the node pools the task owns (``delete_on_kill``: the
plan's pool names and the task's ``tpuflow-key`` label; pools with another owner are left alone;
None when the operator's ``on_kill_action`` is ``"keep"``).
A pool whose create is still running cannot be deleted until that create ends, so the deletion
waits for it: within ``[triggerer] on_kill_timeout`` when it can, then on in the triggerer's event
loop (lost if the triggerer restarts first; the log names the pools). ``cleanup()`` is not
overridden: it also runs on triggerer restarts, where nothing may be deleted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.sdk import conf
from airflow.triggers.base import TriggerEvent

from tpuflow.gke.hooks import GKENodePoolAsyncHook
from tpuflow.gke.waits import wait_for_operation, wait_until
from tpuflow.triggers import TpuflowTrigger

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
                log.error(
                    "Task killed, but GKE is still busy with node pool(s) %s after %.0f s; delete them by "
                    "hand (label tpuflow-key=%s)",
                    names,
                    _KILL_PATIENCE_S,
                    owned.get("owner_key"),
                )
                return
            if names:
                log.info("Task killed: GKE is still creating node pool(s) %s; deleting once that ends", names)
                await asyncio.sleep(interval)
    except Exception:
        log.exception("Task killed, but deleting its node pools %s failed", owned.get("node_pool_names"))


async def delete_owned_node_pools(owned: dict[str, Any], log: Any) -> None:
    """on_kill of the create task's waits: delete its pools, waiting out creates still running."""

    task = asyncio.ensure_future(_delete_when_possible(owned, log))
    _KILLS.add(task)
    task.add_done_callback(_KILLS.discard)
    budget = 0.8 * conf.getfloat("triggerer", "on_kill_timeout", fallback=30.0)
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=budget)
    except TimeoutError:
        log.warning(
            "Node pool(s) %s are still being created; they are deleted when GKE allows it, from this "
            "triggerer's event loop",
            owned.get("node_pool_names"),
        )


class _NodePoolWaitTrigger(TpuflowTrigger):
    """A wait of the node pool operators; killing the task deletes what ``delete_on_kill`` names."""

    delete_on_kill: dict[str, Any] | None

    async def on_kill(self) -> None:
        """The user marked the deferred task failed/success or cleared it (during an operation or a
        backoff, e.g. after a stockout): delete the pools the create task owns so far."""
        if self.delete_on_kill:
            await delete_owned_node_pools(self.delete_on_kill, self.log)


class GKENodePoolOperationTrigger(_NodePoolWaitTrigger):
    """Wait until a GKE operation is DONE (tpuflow.gke.waits.wait_for_operation through the async hook).

    The event carries ``resume`` (the operator's progress) and, on success, ``operation_name``.
    ``delete_on_kill``: what on_kill deletes (None: nothing, e.g. ``on_kill_action="keep"``).
    ``operation_timeout``: seconds the operation may run (from its startTime) before the event is a timeout;
    None (triggers serialised by earlier versions): no deadline.
    ``use_dns_endpoint`` is accepted from triggers serialised by earlier versions and not used.
    """

    serialize_fields = (
        "operation_name",
        "project_id",
        "location",
        "gcp_conn_id",
        "impersonation_chain",
        "poll_interval",
        "resume",
        "delete_on_kill",
        "operation_timeout",
    )

    def __init__(
        self,
        operation_name: str,
        project_id: str | None,
        location: str,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        poll_interval: float = 10.0,
        resume: dict[str, Any] | None = None,
        delete_on_kill: dict[str, Any] | None = None,
        operation_timeout: float | None = None,
        use_dns_endpoint: bool = False,
    ) -> None:
        super().__init__()
        self.operation_name = operation_name
        self.project_id = project_id
        self.location = location
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = (
            list(impersonation_chain) if isinstance(impersonation_chain, (list, tuple)) else impersonation_chain
        )
        self.poll_interval = float(poll_interval)
        self.resume = resume or {}
        self.delete_on_kill = delete_on_kill
        self.operation_timeout = None if operation_timeout is None else float(operation_timeout)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = GKENodePoolAsyncHook(
            gcp_conn_id=self.gcp_conn_id, location=self.location, impersonation_chain=self.impersonation_chain
        )
        event = await wait_for_operation(
            lambda: hook.get_operation(self.operation_name, project_id=self.project_id),  # type: ignore[arg-type]
            self.operation_name,
            poll_interval=self.poll_interval,
            log=self.log,
            timeout=self.operation_timeout,
        )
        yield TriggerEvent({**event, "resume": self.resume})


class NodePoolBackoffTrigger(_NodePoolWaitTrigger):
    """Wait until ``wake_at`` (unix time, so a triggerer restart does not lengthen the wait)."""

    serialize_fields = ("wake_at", "reason", "resume", "delete_on_kill")

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

    async def run(self) -> AsyncIterator[TriggerEvent]:
        event = await wait_until(self.wake_at, self.reason)
        yield TriggerEvent({**event, "resume": self.resume})
