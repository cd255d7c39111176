"""The node pool operators' waits: one coroutine each, run by a trigger or (non-deferrable) by asyncio.run.

Each returns a tpuflow.events event. ``wait_for_operation`` reports success once the operation is
DONE, failed or not: GKE marks a failed operation DONE with ``operation.error`` set, and the
provisioning loop reads and classifies the finished operation itself. It reports ``timeout`` once the
operation has run longer than ``timeout`` seconds, counted from the operation's own ``startTime`` so a
resumed or retried wait keeps the same deadline. Nothing is cancelled then: GKE cancels only node pool
upgrades (``gcloud container operations cancel``), so a stuck create or delete runs on until GKE ends it,
and the pool is deleted by the teardown once GKE allows it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from google.cloud.container_v1.types import Operation

from tpuflow.events import make_event
from tpuflow.gke.hooks import ACTIVE_OPERATION
from tpuflow.polling import poll_delays


def started_at(operation: Operation) -> float | None:
    """The operation's startTime (RFC 3339) as unix time; None when GKE gave none that parses."""
    try:
        return datetime.fromisoformat(operation.start_time).timestamp() if operation.start_time else None
    except ValueError:
        return None


async def wait_for_operation(
    get_operation: Callable[[], Awaitable[Operation]],
    name: str,
    *,
    poll_interval: float,
    log: Any,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Poll ``get_operation`` until the operation is DONE, or until it has run ``timeout`` seconds."""
    waiting_since = time.time()
    delays = poll_delays(poll_interval)
    try:
        while True:
            operation = await get_operation()
            if operation.status == Operation.Status.DONE:
                return make_event("success", f"GKE operation {name} is done", operation_name=operation.name)
            ran = time.time() - (started_at(operation) or waiting_since)
            if timeout is not None and operation.status in ACTIVE_OPERATION and ran > timeout:
                return make_event(
                    "timeout",
                    f"GKE operation {name} ({operation.operation_type.name} {operation.target_link.rsplit('/', 1)[-1]})"
                    f" is still {operation.status.name} after {ran:.0f} s, longer than operation_timeout "
                    f"({timeout:g} s). GKE cannot cancel it; the node pool is deleted once GKE ends the operation "
                    f"(the teardown task waits for it; `tpuflow reap` deletes what an ended run left). Look at it "
                    f"with `gcloud container operations describe {name.rsplit('/', 1)[-1]}`, or raise "
                    "operation_timeout if such slices take longer to create here.",
                    operation_name=operation.name,
                )
            if operation.status not in ACTIVE_OPERATION:
                # e.g. ABORTING: this operation will not finish; a retry of the task looks at the pools again
                return make_event(
                    "failed",
                    f"GKE operation {name} is {operation.status.name}",
                    retryable=True,
                    operation_name=operation.name,
                )
            delay = next(delays)
            log.debug("GKE operation %s is %s; next look in %.1f s", name, operation.status.name, delay)
            left = delay if timeout is None else max(timeout - ran, 0.0) + 0.1
            await asyncio.sleep(min(delay, left))
    except Exception as err:
        log.exception("Reading GKE operation %s failed", name)
        return make_event("error", f"reading GKE operation {name} failed: {type(err).__name__}: {err}")


async def wait_until(wake_at: float, reason: str) -> dict[str, Any]:
    """Sleep until ``wake_at`` (unix time, so a restarted wait does not last longer)."""
    await asyncio.sleep(max(0.0, wake_at - time.time()))
    return make_event("success", f"waited: {reason}")
