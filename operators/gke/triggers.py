"""Deferral triggers for the node pool operators.

``GKENodePoolOperationTrigger`` is the google provider's GKEOperationTrigger (poll until DONE) with
our async hook, which honours the connection's endpoint/transport extras. The provider's trigger
reports success on DONE without looking at ``operation.error``; the operator's execute_complete
fetches the finished operation and checks it.

Both triggers hand the operator's progress back in the event (``resume``) instead of relying on
the deferral's next_kwargs: ``dag.test()`` in Airflow 3.3 replaces next_kwargs with the event, so
state passed only there is lost in tests and local runs. Trigger kwargs are plain JSON values.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEOperationTrigger
from airflow.triggers.base import BaseTrigger, TriggerEvent

from operators.gke.hooks import GKENodePoolAsyncHook


class GKENodePoolOperationTrigger(GKEOperationTrigger):
    def __init__(self, *args: Any, resume: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resume = resume or {}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return f"{type(self).__module__}.{type(self).__qualname__}", {**kwargs, "resume": self.resume}

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

    def __init__(self, wake_at: float, reason: str = "", resume: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.wake_at = float(wake_at)
        self.reason = reason
        self.resume = resume or {}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"wake_at": self.wake_at, "reason": self.reason, "resume": self.resume},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await asyncio.sleep(max(0.0, self.wake_at - time.time()))
        yield TriggerEvent({"status": "success", "message": f"waited: {self.reason}", "resume": self.resume})
