"""A Ray job's success ends its task in the triggerer (RayJobTrigger + RaySubmitJobOperator.task_end) with the
value execute_complete would return; a result below the quality gate, a stopped job to replace, a failure and
an operator with success work of its own resume the task on a worker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from airflow.triggers.base import TriggerEvent

from tpuflow.rayjob.operators import QualityGateError, RaySubmitJobOperator
from tpuflow.rayjob.triggers import RayJobTrigger
from tpuflow.rayjob.workload_operators import RayTrainOperator
from tpuflow.triggers import TaskEndedEvent

RESULT = {"accuracy": 0.75, "metrics": {"loss": 0.2}}


class EndedJob:
    """A job already in ``status`` whose driver log ends with its result line (or a traceback)."""

    def __init__(self, status: str = "SUCCEEDED", log: str | None = None) -> None:
        self.status = status
        self.log = log if log is not None else f"step 0\nTPUFLOW_RESULT {json.dumps(RESULT)}\n"

    async def aget_job_info(self, sid: str) -> dict[str, Any]:
        return {"status": self.status, "message": "Job finished"}

    async def aget_job_logs(self, sid: str) -> str:
        return self.log

    async def atail_job_logs(self, sid: str) -> AsyncIterator[str]:
        yield self.log


@pytest.fixture
def xcoms(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from airflow.sdk.execution_time.xcom import XCom

    store: dict[str, Any] = {}

    async def aset(key: str, value: Any, **where: Any) -> None:
        store[key] = value

    async def aget_one(**where: Any) -> Any:
        return None

    monkeypatch.setattr(XCom, "aset", staticmethod(aset))
    monkeypatch.setattr(XCom, "aget_one", staticmethod(aget_one))
    return store


def fire(end_task: dict[str, Any] | None, job: EndedJob, **kwargs: Any) -> TriggerEvent:
    _, serialized = RayJobTrigger(
        submission_id="s1", cluster={"dashboard_url": "http://x"}, poll_interval=0.01, end_task=end_task, **kwargs
    ).serialize()
    trigger = RayJobTrigger(**json.loads(json.dumps(serialized)))  # as the triggerer rebuilds it
    trigger.task_instance = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1)
    trigger._hook = lambda: job  # type: ignore[method-assign]
    return asyncio.run(anext(trigger.run()))


def op(**kwargs: Any) -> RaySubmitJobOperator:
    return RaySubmitJobOperator(
        task_id="user_job", entrypoint="python my_job.py", cluster={"dashboard_url": "x"}, **kwargs
    )


def test_a_succeeded_job_ends_its_task_with_the_value_execute_complete_returns(xcoms) -> None:
    operator = op(min_result={"accuracy": 0.5, "loss": 0.1})
    event = fire(operator.task_end(), EndedJob())
    assert isinstance(event, TaskEndedEvent)
    assert xcoms["return_value"] == RESULT == operator.execute_complete({}, event.payload)


def test_a_result_below_the_gate_resumes_the_worker_which_fails_without_retry(xcoms) -> None:
    operator = op(min_result={"accuracy": 0.9})
    event = fire(operator.task_end(), EndedJob())
    assert type(event) is TriggerEvent and "return_value" not in xcoms
    with pytest.raises(QualityGateError, match=r"accuracy=0.75 is below the required 0.9"):
        operator.execute_complete({}, event.payload)


def test_do_xcom_push_false_ends_the_task_without_a_value(xcoms) -> None:
    assert isinstance(fire(op(do_xcom_push=False).task_end(), EndedJob()), TaskEndedEvent)
    assert "return_value" not in xcoms


def test_a_failed_job_and_a_stopped_job_to_replace_resume_the_worker(xcoms) -> None:
    failed = fire(op().task_end(), EndedJob("FAILED", "Traceback (most recent call last):\nValueError: broken\n"))
    assert type(failed) is TriggerEvent and failed.payload["status"] == "failed"
    with pytest.raises(AirflowFailException):
        op().execute_complete({}, failed.payload)
    stopped = fire(op().task_end(), EndedJob("STOPPED"), restart_if_stopped=True)
    assert type(stopped) is TriggerEvent and stopped.payload["job_status"] == "STOPPED"
    assert "return_value" not in xcoms


@pytest.mark.parametrize(
    "operator",
    [
        op(log_uri="gs://b/logs/job.log"),  # the driver log is kept from the worker
        op(train_run_path="gs://b/runs/r1"),  # Ray Train's record is read from the worker
    ],
)
def test_operators_with_success_work_of_their_own_resume_on_a_worker(operator: RaySubmitJobOperator) -> None:
    assert operator.task_end() is None


def test_training_resumes_on_a_worker() -> None:
    train = RayTrainOperator.__new__(RayTrainOperator)  # task_end reads no argument
    assert train.task_end() is None
