"""Take a slice lease before a cluster starts, give it back in a teardown.

    checked >> acquire >> start_cluster >> ... >> stop_cluster >> release
    release.as_teardown(setups=acquire)

The limit (`max_slices`) is templated, so it can come from an Airflow Variable and be changed
without a deploy: "{{ var.value.get('tpuflow_max_slices', 1) }}".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

# imported with the DAG (not in a task): an `airflow dags test` process names itself its runs' supervisor before
# its executor forks a task process (tpuflow.liveness)
from tpuflow import liveness
from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.deprecations import warn_renamed
from tpuflow.events import raise_for_event
from tpuflow.tpu.slice_argument import resolve_slice
from tpuflow.validation import check_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context


def lease_holder(context: Context) -> str:
    """One lease per DAG run: every try and every task of the run names the same holder."""
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}"


def run_state(ti: Any, dag_id: str, run_id: str) -> str | None:
    """The state of run ``dag_id/run_id`` as the metadata DB says ("running", "success", ..., "gone from the
    metadata DB"), or None when it cannot be read."""
    try:
        state = ti.get_dagrun_state(dag_id=dag_id, run_id=run_id)
    except Exception as err:  # the Task SDK answers a deleted run with the API server's 404
        text = str(err).lower()
        return "gone from the metadata DB" if "404" in text or "not found" in text or "not_found" in text else None
    return str(getattr(state, "value", state))


def run_is_over(ti: Any, dag_id: str, run_id: str) -> str | None:
    """Why the run ``dag_id/run_id`` can no longer use a slice ("failed", "gone from the metadata DB"),
    or None while it may (running, queued) or when its state cannot be read."""
    state = run_state(ti, dag_id, run_id)
    return state if state in ("success", "failed", "gone from the metadata DB") else None


class TPUAcquireSliceOperator(ArgumentChecks, BaseOperator):
    """Claim one of ``max_slices`` slice leases; wait (deferred, on the triggerer) while all are taken.

    One lease per DAG run: every try and every task of the run names the same holder
    (``DAG_ID/RUN_ID``), so a retry keeps its slot. Returns ``{"slot", "holder", "lease_root",
    "max_slices"}``.

    :param max_slices: how many slices may be in use at once across every run sharing ``lease_root``
        (a whole number >= 1; templated, e.g. from an Airflow Variable).
    :param tpu_slice: the run's slice (tpuflow.tpu.slice_argument: a TpuSlice, its to_dict() or
        {"accelerator", "topology", "num_slices", ...}, templated): one lease per slice of its ``num_slices``,
        taken together; more than ``max_slices`` fails at once. None: one slice.
    :param lease_root: local folder or ``gs://BUCKET/PREFIX`` (templated); default
        ``$TPUFLOW_SLICE_LEASES``, else ``slice-leases/`` under ``$TPUFLOW_HOME`` (``~/.tpuflow``).
    :param gcp_conn_id: Google Cloud connection for a ``gs://`` lease root.
    :param poll_interval: seconds between looks at the leases while waiting.
    :param wait_timeout: seconds to wait for a lease before failing (default: wait as long as it takes).
    :param deferrable: wait for a free lease in the triggerer (default: the wait may last as long as other
        runs hold the slices); False: in this worker, through the same wait.
    """

    template_fields: Sequence[str] = ("max_slices", "lease_root", "tpu_slice")
    ui_color = "#f3e5f5"

    def __init__(
        self,
        *,
        max_slices: int | str = 1,
        tpu_slice: Any = None,
        lease_root: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        poll_interval: float = 5.0,
        wait_timeout: float | None = None,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_slices = max_slices
        self.tpu_slice = tpu_slice
        self.lease_root = lease_root
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = poll_interval
        self.wait_timeout = wait_timeout
        self.deferrable = deferrable

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.poll_interval,), lambda: check_seconds("poll_interval", self.poll_interval)),
            ((self.wait_timeout,), lambda: check_seconds("wait_timeout", self.wait_timeout, optional=True)),
            ((self.max_slices, self.lease_root, self.tpu_slice), self.lease_request),
        ]

    def lease_request(self) -> tuple[int, str | None, int]:
        """The slot count, lease root (None: the default) and slices wanted, or UserInputError naming the field."""
        from tpuflow.slices.leases import check_lease_root, parse_count, parse_slots

        slots = parse_slots(self.max_slices)
        wanted = 1 if self.tpu_slice is None else resolve_slice(self.tpu_slice).num_slices
        return slots, check_lease_root(self.lease_root), parse_count(wanted, slots, "tpu_slice.num_slices")

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate_arguments()  # the rendered values, before any lease is touched
        self._record_supervisor(context)
        return self._claim(context)

    def _record_supervisor(self, context: Context) -> None:
        """Record which process supervises this run (tpuflow.slices.supervision), before anything is made: the
        reaper then takes what a killed run left, whatever the metadata DB still says of it."""
        from tpuflow.slices.leases import default_lease_root
        from tpuflow.slices.supervision import SupervisionStore

        _, root, _ = self.lease_request()
        ti, run = context["ti"], context.get("dag_run")
        when = getattr(run, "logical_date", None) or getattr(run, "run_after", None)
        date = when.strftime("%Y-%m-%d") if when is not None else None
        store = SupervisionStore(root or default_lease_root(), self.gcp_conn_id)
        entry = store.record(ti.dag_id, ti.run_id, date, liveness.supervisor_record())
        self.log.info("Run supervised by %s (recorded in %s)", liveness.describe(entry.supervisor), store.describe())

    def _claim(self, context: Context) -> dict[str, Any]:
        """Take the run's lease(s); while all are held, wait for a free one (triggerer or here), then claim again."""
        from tpuflow.slices.leases import default_lease_root, lease_store

        slots, root, count = self.lease_request()
        root = root or default_lease_root()
        store = lease_store(root, self.gcp_conn_id)
        holder = lease_holder(context)
        lease = store.try_acquire(holder, slots, count)
        if lease is None:
            self._renew_for_live_runs(context, store, slots, holder)
        if lease is None and self._take_over_from_dead_holders(store, slots, holder):
            lease = store.try_acquire(holder, slots, count)
        if lease is None and self._reclaim_from_runs_that_are_over(context, store, slots, holder):
            lease = store.try_acquire(holder, slots, count)
        if lease is not None:
            self.log.info(
                "Slice lease(s) for %d slice(s) of %d taken for %s (%s)", count, slots, holder, store.describe()
            )
            return {"slot": lease.slot, "holder": holder, "lease_root": root, "max_slices": slots, "num_slices": count}
        held = sorted(x.holder_line() for x in store.holders(slots).values())
        self.log.info(
            "All %d slice lease(s) in %s are held (%s): waiting in %s. A lease left by a deleted or "
            "killed run is freed with `tpuflow leases free DAG_ID/RUN_ID`.",
            slots,
            store.describe(),
            ", ".join(held),
            "the triggerer" if self.deferrable else "this worker",
        )
        wait = {"lease_root": root, "slots": slots, "holder": holder, "count": count}
        if self.deferrable:
            self.execute_async(context, wait)
        return self.execute_sync(context, wait)

    def execute_async(self, context: Context, wait: dict[str, Any]) -> None:
        """Defer: SliceLeaseTrigger watches the leases in the triggerer."""
        from tpuflow.slices.triggers import SliceLeaseTrigger

        self.defer(
            trigger=SliceLeaseTrigger(
                gcp_conn_id=self.gcp_conn_id, poll_interval=self.poll_interval, timeout=self.wait_timeout, **wait
            ),
            method_name="execute_complete",
        )

    def execute_sync(self, context: Context, wait: dict[str, Any]) -> dict[str, Any]:
        """Wait here: the trigger's own coroutine (wait_for_free_slot) with asyncio.run."""
        from tpuflow.slices.leases import lease_store
        from tpuflow.slices.triggers import wait_for_free_slot

        event = asyncio.run(
            wait_for_free_slot(
                lease_store(wait["lease_root"], self.gcp_conn_id),
                slots=wait["slots"],
                holder=wait["holder"],
                count=wait["count"],
                deadline=None if self.wait_timeout is None else time.time() + float(self.wait_timeout),
                poll_interval=float(self.poll_interval),
                log=self.log,
            )
        )
        return self.execute_complete(context, dict(event))

    def _renew_for_live_runs(self, context: Context, store: Any, slots: int, holder: str) -> list[int]:
        """Renew the expired gs:// leases of runs the metadata DB says are still running or queued: a run
        that outlives the expiry (a long training) keeps its slice. Only a run that is over, or whose state
        cannot be read, loses an expired lease."""
        renewed: list[int] = []
        now = time.time()
        for other in sorted(
            {
                lease.holder
                for lease in store.holders(slots).values()
                if lease.holder != holder and lease.expires_at is not None and lease.expires_at < now
            }
        ):
            dag_id, _, run_id = other.partition("/")
            state = run_state(context["ti"], dag_id, run_id) if run_id else None
            if state in ("running", "queued"):
                for slot in store.renew(other, slots):
                    self.log.info("renewed the expired slice lease %d of %s: the run is still %s", slot, other, state)
                    renewed.append(slot)
        return renewed

    def _take_over_from_dead_holders(self, store: Any, slots: int, holder: str) -> list[int]:
        """Free the leases whose holder is provably dead (its supervising process exited, was replaced by a
        reused pid, or its host rebooted) or past its expiry: a killed run must not block the next one."""
        freed = []
        for lease, reason in store.take_over_dead(slots, holder):
            self.log.warning("took over slice lease %d of %s: %s", lease.slot, lease.holder, reason)
            freed.append(lease.slot)
        return freed

    def _reclaim_from_runs_that_are_over(self, context: Context, store: Any, slots: int, holder: str) -> list[str]:
        """Give back the leases of runs that are over (finished, or deleted from the metadata DB) whose
        teardown never ran: a killed run must not block the next one. Asked through the Task SDK; a run
        whose state cannot be read keeps its lease (`tpuflow reap` or `tpuflow leases free` then decide)."""
        freed = []
        for other in sorted({lease.holder for lease in store.holders(slots).values()} - {holder}):
            dag_id, _, run_id = other.partition("/")
            reason = run_is_over(context["ti"], dag_id, run_id) if run_id else None
            if reason is not None:
                store.release(other)
                freed.append(other)
                self.log.warning("Slice lease of %s given back: the run is over (%s)", other, reason)
        return freed

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        raise_for_event(event, f"waiting for a slice lease (wait_timeout={self.wait_timeout}s)")
        return self._claim(context)  # may wait again if another run claimed the slot first


class TPUReleaseSliceOperator(ArgumentChecks, BaseOperator):
    """Give back this run's slice lease (a teardown: runs even when the pipeline failed).

    Frees every slot the run (``DAG_ID/RUN_ID``) holds and returns their numbers.

    :param lease_root: where the leases are (templated); the same as the acquire task's.
    :param gcp_conn_id: Google Cloud connection for a ``gs://`` lease root.
    """

    template_fields: Sequence[str] = ("lease_root",)
    ui_color = "#f3e5f5"

    def __init__(
        self, *, lease_root: str | None = None, gcp_conn_id: str = "google_cloud_default", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.lease_root = lease_root
        self.gcp_conn_id = gcp_conn_id

    def argument_checks(self) -> list[ArgumentCheck]:
        return [*super().argument_checks(), ((self.lease_root,), self.checked_lease_root)]

    def checked_lease_root(self) -> str | None:
        """The lease root (None: the default, nothing to check), or UserInputError naming ``lease_root``."""
        if self.lease_root is None or self.lease_root == "":
            return None  # without loading the lease store at DAG parse time
        from tpuflow.slices.leases import check_lease_root

        return check_lease_root(self.lease_root)

    def execute(self, context: Context) -> list[int]:
        from tpuflow.slices.leases import default_lease_root, lease_store

        self.validate_arguments()
        store = lease_store(self.checked_lease_root() or default_lease_root(), self.gcp_conn_id)
        holder = lease_holder(context)
        freed = store.release(holder)
        self.log.info("Released slice lease(s) %s of %s in %s", freed or "none", holder, store.describe())
        return freed


# Old names, kept for one release (tpuflow.deprecations): each warns and is the renamed class.
class AcquireSliceOperator(TPUAcquireSliceOperator):
    """Deprecated: renamed TPUAcquireSliceOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("AcquireSliceOperator", TPUAcquireSliceOperator)
        super().__init__(**kwargs)


class ReleaseSliceOperator(TPUReleaseSliceOperator):
    """Deprecated: renamed TPUReleaseSliceOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("ReleaseSliceOperator", TPUReleaseSliceOperator)
        super().__init__(**kwargs)
