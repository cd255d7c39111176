"""The node pool operators' waits: one coroutine each, run by a trigger or (non-deferrable) by asyncio.run.

Each returns a tpuflow.events event. ``wait_for_operation`` reports success once the operation is
DONE, failed or not: GKE marks a failed operation DONE with ``operation.error`` set, and the
provisioning loop reads and classifies the finished operation itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.cloud.container_v1.types import Operation
from tpuflow.events import make_event
from tpuflow.gke.hooks import ACTIVE_OPERATION


async def wait_for_operation(
    get_operation: Callable[[], Awaitable[Operation]], name: str, *, poll_interval: float, log: Any
) -> dict[str, Any]:
    """Poll ``get_operation`` until the operation is DONE."""
    try:
        while True:
            operation = await get_operation()
            if operation.status == Operation.Status.DONE:
                return make_event("success", f"GKE operation {name} is done", operation_name=operation.name)
            if operation.status not in ACTIVE_OPERATION:
                # e.g. ABORTING: this operation will not finish; a retry of the task looks at the pools again
                return make_event(
                    "failed",
                    f"GKE operation {name} is {operation.status.name}",
                    retryable=True,
                    operation_name=operation.name,
                )
            log.debug("GKE operation %s is %s; next look in %.1f s", name, operation.status.name, poll_interval)
            await asyncio.sleep(poll_interval)
    except Exception as err:
        log.exception("Reading GKE operation %s failed", name)
        return make_event("error", f"reading GKE operation {name} failed: {type(err).__name__}: {err}")


async def wait_until(wake_at: float, reason: str) -> dict[str, Any]:
    """Sleep until ``wake_at`` (unix time, so a restarted wait does not last longer)."""
    await asyncio.sleep(max(0.0, wake_at - time.time()))
    return make_event("success", f"waited: {reason}")
