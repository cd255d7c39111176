"""What a task did on a slice, and when: the record the ledger's timeline is built from.

A task that runs work on a slice (a Ray job, a Serve deployment) pushes one XCom under ``WORK_SPAN_KEY``:
``{"cause", "started_at", "ended_at"}`` in unix seconds by the cluster's clock (Ray's job details), with
``ended_at`` None for work that lasts until the slice goes (a Serve endpoint). Pure module.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

WORK_SPAN_KEY = "work_span"
# what a Ray job's time on a slice is counted as, by the operator that ran it (a slice entry may override)
JOB, TRAINING, PREFLIGHT, DATA_PREP, EVALUATION, SERVING = (
    "job",
    "training",
    "preflight",
    "data_prep",
    "evaluation",
    "serving",
)


def work_span(cause: str, started_at: float | None, ended_at: float | None, **extra: Any) -> dict[str, Any]:
    return {"cause": cause, "started_at": started_at, "ended_at": ended_at, **extra}


def job_work_span(cause: str, event: Mapping[str, Any], submission_id: Any) -> dict[str, Any] | None:
    """A Ray job wait's event as a work span; a training job's carries its loop's ``breakdown``
    (the driver's ``goodput`` seconds by cause, tpuflow_driver.goodput). None: the job's span is unknown."""
    span = event.get("job_span")
    if not span:
        return None
    raw_result = event.get("result")
    result: Mapping[str, Any] = raw_result if isinstance(raw_result, Mapping) else {}
    raw_measured = result.get("goodput")
    measured: Mapping[str, Any] = raw_measured if isinstance(raw_measured, Mapping) else {}
    raw_breakdown = measured.get("seconds")
    breakdown = raw_breakdown if isinstance(raw_breakdown, Mapping) else None
    return work_span(cause, span[0], span[1], submission_id=submission_id, breakdown=breakdown)


def push_open_span(context: Any, cause: str) -> None:
    """Record work that starts now and lasts until the slice is deleted (a Serve endpoint on it)."""
    context["ti"].xcom_push(key=WORK_SPAN_KEY, value=work_span(cause, time.time(), None))


def tasks_on_cluster(tasks: Any, cluster_task_id: str) -> list[str]:
    """The ids of ``tasks`` whose ``cluster`` argument is the XCom of ``cluster_task_id`` (a team's own Ray jobs on
    the slice, given tpuflow.pipeline.handles.training_cluster): their work spans are work on that slice."""
    found = []
    for task in tasks:
        operator = getattr(getattr(task, "cluster", None), "operator", None)
        if getattr(operator, "task_id", None) == cluster_task_id:
            found.append(task.task_id)
    return found
