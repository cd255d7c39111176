"""Training held to the run's chip-hour budget: the job is stopped when the ledger would cross it.

The ledger grows linearly while training runs (only the slices already created bill), so the moment
it crosses ``max_chip_hours`` is known when the job starts: it becomes the job's timeout. At that
moment the Ray job wait stops the job (Ray Train keeps the checkpoints it reported), and the task
fails without a retry; the teardowns delete the slice. A retry started after the budget is spent
fails at once, before submitting anything.

``RayTrainOperator(budget=ChipHourBudget(...))``: the training operator holds its job to any
tpuflow.rayjob.budget.TrainingBudget; this is the chip-hour one (it reads the GKE ledger, a layer above
the training operator).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpuflow.cost.budget import check_max_chip_hours
from tpuflow.cost.operators import gke_slice_spans, slice_chips
from tpuflow.deprecations import warn_replaced
from tpuflow.limits import admin_limits, hold_budget
from tpuflow.rayjob.budget import TrainingBudget
from tpuflow.rayjob.workload_operators import RayTrainOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


class ChipHourBudget(TrainingBudget):
    """The run's chip-hour budget for RayTrainOperator's ``budget``: the training is stopped (and fails, not
    retried) when the run's chip-hours reach ``max_chip_hours``.

    :param max_chip_hours: templated; the budget, held at the admin's ceiling (Variable ``tpuflow_max_chip_hours``,
        tpuflow.limits): None/empty or larger is the ceiling.
    :param ledger_slices: templated; the slices billed so far, as GKEWriteChipLedgerOperator's ``slices``.
    :param gcp_conn_id: templated; the GKE connection (the pools' operations give the spans).
    :param project_id: templated; the cluster's project.
    :param location: templated; the cluster's location.
    """

    template_fields: Sequence[str] = ("max_chip_hours", "ledger_slices", "gcp_conn_id", "project_id", "location")

    def __init__(
        self,
        *,
        max_chip_hours: Any = None,
        ledger_slices: Any = None,
        gcp_conn_id: str = "google_cloud_default",
        project_id: str = "",
        location: str = "",
    ) -> None:
        self.max_chip_hours = max_chip_hours
        self.ledger_slices = ledger_slices
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        self.location = location

    def __repr__(self) -> str:  # what the rendered-template view and the serialized DAG show
        return f"ChipHourBudget(max_chip_hours={self.max_chip_hours!r}, ledger_slices={self.ledger_slices!r})"

    def held_budget(self) -> tuple[float, str]:
        """(the budget the run is held to: max_chip_hours within the admin's ceiling, the line saying so if it is
        not what was asked)."""
        held = hold_budget(check_max_chip_hours(self.max_chip_hours, "max_chip_hours"), admin_limits().max_chip_hours)
        return held.value, held.note

    def held_note(self) -> str:
        return self.held_budget()[1]

    def seconds_left(self, context: Context) -> tuple[float | None, str]:
        """(seconds until the ledger crosses the budget, what it is made of); None: no slice to hold to it."""

        budget, _ = self.held_budget()
        if not self.ledger_slices:
            return None, ""
        now = time.time()
        spans = gke_slice_spans(context, self.ledger_slices, self.gcp_conn_id, self.project_id, self.location)
        used, open_chips = 0.0, 0
        for entry, (created, deleted, *_) in zip(self.ledger_slices, spans, strict=True):
            if created is None:
                continue
            chips = slice_chips(entry["tpu"])
            used += chips * ((deleted or now) - created) / 3600.0
            if deleted is None:
                open_chips += chips
        said = f"{used:.4f} of max_chip_hours={budget} used by {open_chips} chips held"
        if open_chips == 0:
            return (float("inf") if used < budget else 0.0), said
        return (budget - used) * 3600.0 / open_chips, said

    def spent_message(self, said: str, storage_path: str) -> str:
        return (
            f"Training stopped: the run reached its chip-hour budget ({said}). Ray Train's last checkpoint "
            f"is kept under {storage_path}; the teardowns delete the slice. Raise max_chip_hours (up "
            "to the admin's Variable tpuflow_max_chip_hours) and rerun to resume from it."
        )


class BudgetedRayTrainOperator(RayTrainOperator):
    """Deprecated: RayTrainOperator(budget=ChipHourBudget(...)); this name goes in the next release.

    :param max_chip_hours: ChipHourBudget's.
    :param ledger_slices: ChipHourBudget's.
    :param gcp_conn_id: ChipHourBudget's.
    :param project_id: ChipHourBudget's.
    :param location: ChipHourBudget's.
    """

    def __init__(
        self,
        *,
        max_chip_hours: Any = None,
        ledger_slices: Any = None,
        gcp_conn_id: str = "google_cloud_default",
        project_id: str = "",
        location: str = "",
        **kwargs: Any,
    ) -> None:
        warn_replaced(type(self).__name__, "RayTrainOperator(budget=ChipHourBudget(...))")
        budget = ChipHourBudget(
            max_chip_hours=max_chip_hours,
            ledger_slices=ledger_slices,
            gcp_conn_id=gcp_conn_id,
            project_id=project_id,
            location=location,
        )
        super().__init__(budget=budget, **kwargs)
