"""A person's approval for a run over its chip-hour budget (``over_budget="ask"``), through Airflow's own
human-in-the-loop: the task waits in Airflow's *awaiting input* state, the UI's Required Actions show the
estimate and its basis, and a person approves or rejects there or through the REST API's ``hitlDetails``.

Cheap to import (the DAG files import it): the standard provider's HITL module only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

OVER_BUDGET_CHOICES = ("fail", "ask")


class ChipBudgetApprovalOperator(ApprovalOperator):
    """Ask for approval when the budget guard found the run over ``max_chip_hours`` and was told to ask.

    Within the budget (or with no budget, or ``over_budget="fail"``, where the guard itself failed the run)
    it ends at once without asking. Over it, it is Airflow's ApprovalOperator: *Approve* lets the run
    provision; *Reject* skips everything downstream but the teardowns (nothing was provisioned yet); no
    answer within ``response_timeout`` fails the task, and the run with it, before anything billable.

    :param guard_task_id: the ChipBudgetGuardOperator's task id (its XCom says whether to ask, and why).

    Every other argument is ApprovalOperator's (``subject`` has a default; ``body`` is written from the guard's
    estimate when the task runs).
    """

    ui_color = "#fff3cd"
    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "guard_task_id")

    def __init__(
        self,
        *,
        guard_task_id: str = "budget_guard",
        subject: str = "Run {{ run_id }} of {{ dag.dag_id }} is over its chip-hour budget: approve it?",
        response_timeout: timedelta | None = timedelta(hours=4),
        **kwargs: Any,
    ) -> None:
        super().__init__(subject=subject, response_timeout=response_timeout, **kwargs)
        self.guard_task_id = guard_task_id

    def execute(self, context: Context) -> Any:
        guard = context["ti"].xcom_pull(task_ids=self.guard_task_id)
        if not (isinstance(guard, Mapping) and guard.get("over_budget") and guard.get("over_budget_action") == "ask"):
            self.log.info("Nothing to approve: the run is within its chip-hour budget (or has none)")
            return {"asked": False}
        self.body = (
            f"The run would use about **{guard['estimate']:.3f} chip-hours**, over its budget "
            f"`max_chip_hours={guard['max_chip_hours']}`.\n\nEstimated from {guard['basis']}.\n\n"
            "*Approve* provisions the slices and runs it (training is still stopped at the budget); *Reject* ends "
            "the run before anything is provisioned."
        )
        self.log.info("Over budget: waiting for a person to approve or reject (%s)", guard["basis"])
        return super().execute(context)
