"""Deferrable wait for a free slice lease (runs in the triggerer: no worker slot is held meanwhile)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from tpuflow.events import make_event
from tpuflow.triggers import TpuflowTrigger


async def wait_for_free_slot(
    store: Any,
    *,
    slots: int,
    holder: str,
    deadline: float | None,
    poll_interval: float,
    log: Any,
    count: int = 1,
) -> dict[str, Any]:
    """Poll until ``count`` of the ``slots`` leases are free or held by ``holder``, or ``deadline``
    (epoch seconds; None: no deadline). Returns a tpuflow.events event with the holders (``held``)."""
    last: list[str] = []
    while True:
        try:
            # Store calls are file or HTTP I/O: off the triggerer's event loop.
            held = await asyncio.to_thread(store.holders, slots)
        except Exception as err:  # a transient storage error must not kill the wait
            log.warning("could not read slice leases at %s (%s); retrying", store.describe(), err)
            await asyncio.sleep(poll_interval)
            continue
        holders = sorted(lease.holder for lease in held.values())
        dead = {slot: lease.dead_reason() for slot, lease in held.items() if lease.holder != holder}
        dead = {slot: reason for slot, reason in dead.items() if reason is not None}
        if slots - len(held) + holders.count(holder) + len(dead) >= count:
            # The operator takes over the leases of dead holders itself (and logs each).
            message = f"a slice lease is free for {holder}" + (
                f" ({len(dead)} held by a dead run: to take over)" if dead else ""
            )
            return make_event("success", message, held=holders)
        lines = sorted(lease.holder_line() for lease in held.values())
        if lines != last:
            log.info("all %d slice lease(s) held by %s; waiting", slots, ", ".join(lines))
            last = lines
        if deadline is not None and time.time() > deadline:
            return make_event(
                "timeout",
                f"no slice lease became free in time; held by {', '.join(holders)} (a lease left by a "
                "deleted or killed run is freed with `tpuflow leases free DAG_ID/RUN_ID`)",
                held=holders,
            )
        await asyncio.sleep(poll_interval)


class SliceLeaseTrigger(TpuflowTrigger):
    """Fires when `count` of the `slots` leases are free or held by `holder`, or at `timeout`
    seconds after `started_at`. The operator then claims a slot itself; a run that loses the race
    defers again."""

    serialize_fields = (
        "lease_root",
        "slots",
        "holder",
        "gcp_conn_id",
        "poll_interval",
        "timeout",
        "started_at",
        "count",
    )

    def __init__(
        self,
        lease_root: str,
        slots: int,
        holder: str,
        gcp_conn_id: str = "google_cloud_default",
        poll_interval: float = 5.0,
        timeout: float | None = None,
        started_at: float | None = None,
        count: int = 1,
    ) -> None:
        super().__init__()
        self.lease_root = lease_root
        self.slots = int(slots)
        self.holder = holder
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = float(poll_interval)
        self.timeout = timeout
        self.started_at = started_at if started_at is not None else time.time()
        self.count = int(count)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from tpuflow.slices.leases import lease_store

        event = await wait_for_free_slot(
            lease_store(self.lease_root, self.gcp_conn_id),
            slots=self.slots,
            holder=self.holder,
            deadline=None if self.timeout is None else self.started_at + float(self.timeout),
            poll_interval=self.poll_interval,
            log=self.log,
            count=self.count,
        )
        yield TriggerEvent(event)
