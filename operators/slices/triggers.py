"""Deferrable wait for a free slice lease (runs in the triggerer: no worker slot is held meanwhile)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class SliceLeaseTrigger(BaseTrigger):
    """Fires when fewer than `slots` leases are held (or `holder` already holds one), or at `timeout`.

    The operator then claims a slot itself; a run that loses the race defers again.
    """

    def __init__(
        self,
        lease_root: str,
        slots: int,
        holder: str,
        gcp_conn_id: str = "google_cloud_default",
        poll_interval: float = 5.0,
        timeout: float | None = None,
        started_at: float | None = None,
    ) -> None:
        super().__init__()
        self.lease_root = lease_root
        self.slots = int(slots)
        self.holder = holder
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = float(poll_interval)
        self.timeout = timeout
        self.started_at = started_at if started_at is not None else time.time()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "lease_root": self.lease_root,
                "slots": self.slots,
                "holder": self.holder,
                "gcp_conn_id": self.gcp_conn_id,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "started_at": self.started_at,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from tpuflow.slices.leases import lease_store

        store = lease_store(self.lease_root, self.gcp_conn_id)
        last: list[str] = []
        while True:
            try:
                # Store calls are file or HTTP I/O: off the triggerer's event loop.
                held = await asyncio.to_thread(store.holders, self.slots)
            except Exception as err:  # a transient storage error must not kill the wait
                self.log.warning("could not read slice leases at %s (%s); retrying", self.lease_root, err)
                await asyncio.sleep(self.poll_interval)
                continue
            holders = sorted(lease.holder for lease in held.values())
            if self.holder in holders or len(held) < self.slots:
                yield TriggerEvent({"status": "free", "held": holders})
                return
            if holders != last:
                self.log.info("all %d slice lease(s) held by %s; waiting", self.slots, ", ".join(holders))
                last = holders
            if self.timeout is not None and time.time() - self.started_at > self.timeout:
                yield TriggerEvent({"status": "timeout", "held": holders})
                return
            await asyncio.sleep(self.poll_interval)
