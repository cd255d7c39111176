"""The local backend's ledger pieces: the stop task that records its cluster's span, and the ledger over it.

A module of its own so the GKE DAG file never loads the local operators when it is parsed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tpuflow.cost.operators import SliceSpan, TPUWriteChipLedgerOperator
from tpuflow.deprecations import warn_renamed
from tpuflow.local.operators import LocalRayDeleteClusterOperator, _state_dir, load_owned_cluster
from tpuflow.naming import TaskIdentity

if TYPE_CHECKING:
    from airflow.sdk import Context


class LocalWriteChipLedgerOperator(TPUWriteChipLedgerOperator):
    """TPUWriteChipLedgerOperator for the local backend: a slice's ``task_id`` is the stop task
    (LocalStopRecordingSpanOperator), whose XCom holds the simulated cluster's start and stop."""

    def spans(self, context: Context) -> list[SliceSpan]:
        out: list[SliceSpan] = []
        for entry in self.slices:
            span = context["ti"].xcom_pull(task_ids=entry["task_id"]) or {}
            # a simulated slice has no pool to provision: its time to come up is the cluster's start
            out.append(
                SliceSpan(
                    span.get("started_at"),
                    span.get("stopped_at"),
                    [span["name"]] if span.get("name") else [],
                    provisioned_at=span.get("started_at"),
                    cluster_ready_at=span.get("ready_at"),
                )
            )
        return out


class LocalStopRecordingSpanOperator(LocalRayDeleteClusterOperator):
    """LocalRayDeleteClusterOperator that returns the cluster's span for the ledger:
    ``{"name", "started_at", "ready_at", "stopped_at"}`` (``stopped_at`` None when the cluster is kept)."""

    def execute(self, context: Context) -> dict[str, Any]:

        from tpuflow.local.cluster import STATE_FILE

        # the create task's cluster of this run, by its deterministic name (never a folder the XCom names)
        owner = TaskIdentity.from_context(context, self.create_task_id)
        state_dir = _state_dir(self.base_dir, owner)
        span: dict[str, Any] = {"name": state_dir.name, "started_at": None, "ready_at": None, "stopped_at": None}
        state = load_owned_cluster(state_dir, owner)
        if state is not None:
            span["started_at"], span["ready_at"] = state.started_at or None, state.ready_at
        super().execute(context)
        if not (state_dir / STATE_FILE).exists() and span["started_at"] is not None:
            span["stopped_at"] = time.time()
        return span


# Old names, kept for one release (tpuflow.deprecations): each warns and is the renamed class.
class LocalChipLedgerOperator(LocalWriteChipLedgerOperator):
    """Deprecated: renamed LocalWriteChipLedgerOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("LocalChipLedgerOperator", LocalWriteChipLedgerOperator)
        super().__init__(**kwargs)
