"""What RayTrainOperator(budget=...) holds its training to: a budget that says, when the job starts and when
its wait times out, how many seconds of training are left before it is spent.

The seam stays downward: the training operator knows only this interface; tpuflow.cost.training.ChipHourBudget
(the run's chip-hour budget, read from the GKE ledger) implements it one layer up, and a user's own budget
(e.g. a cost in money) can too. A budget's ``template_fields`` are rendered with the task's (Airflow renders a
templated field's nested ``template_fields``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import Context


class TrainingBudget(abc.ABC):
    """A budget a training job is stopped at (RayTrainOperator's ``budget``).

    When the job starts, ``seconds_left`` becomes its timeout (if shorter than ``job_timeout``); none left
    fails the task before anything is submitted. When that timeout stops the job with the budget spent, the
    task fails without a retry, saying ``spent_message``; the job's checkpoints are kept.
    """

    template_fields: Sequence[str] = ()

    @abc.abstractmethod
    def seconds_left(self, context: Context) -> tuple[float | None, str]:
        """(seconds of training left before the budget is spent, a line saying what it is made of); None:
        nothing to hold the training to (no billed resource yet); ``inf``: nothing is being spent."""

    def held_note(self) -> str:
        """A line for the task log when the budget asked for is not the one applied (e.g. held at an
        admin's ceiling); empty when it is."""
        return ""

    def spent_message(self, said: str, storage_path: str) -> str:
        """The task's failure when the budget stopped the training (``said``: ``seconds_left``'s line)."""
        return (
            f"Training stopped: the run reached its budget ({said}). Ray Train's last checkpoint is kept under "
            f"{storage_path}; raise the budget and rerun to resume from it."
        )
