"""Ending a task in the triggerer (tpuflow.triggers): the event Airflow's triggerer reads, the XComs stored
as a worker stores them, and every case that must resume the task on a worker instead."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.triggers.base import DiscrimatedTriggerEvent, TaskSuccessEvent, TriggerEvent
from pydantic import TypeAdapter

from tpuflow.triggers import TaskEndedEvent, TpuflowTrigger, may_end_in_triggerer, task_end

SUCCESS = {"status": "success", "message": "done", "name": "rc"}


class OneShot(TpuflowTrigger):
    """A wait that has already seen ``payload``."""

    serialize_fields = ("payload", "end_task")

    def __init__(self, payload: dict[str, Any], end_task: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.payload, self.end_task = payload, end_task

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield await self.event(self.payload)


@pytest.fixture
def xcoms(monkeypatch: pytest.MonkeyPatch) -> dict[tuple, Any]:
    from airflow.sdk.execution_time.xcom import XCom

    store: dict[tuple, Any] = {}

    async def aset(key: str, value: Any, *, dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> None:
        store[(dag_id, run_id, task_id, map_index, key)] = value

    monkeypatch.setattr(XCom, "aset", staticmethod(aset))
    return store


def fire(trigger: TpuflowTrigger, *, in_triggerer: bool = True) -> TriggerEvent:
    if in_triggerer:  # the triggerer sets the task instance it runs the trigger for
        trigger.task_instance = SimpleNamespace(dag_id="user_dag", run_id="r1", task_id="grp.wait", map_index=3)

    async def first() -> TriggerEvent:
        return await anext(trigger.run())

    return asyncio.run(first())


def test_a_final_success_ends_the_task_as_airflow_reads_it_with_its_xcoms_stored_like_a_workers(xcoms) -> None:
    event = fire(OneShot(SUCCESS, {"xcoms": {"return_value": {"name": "rc", "deleted": True}}}))
    assert isinstance(event, TaskEndedEvent)
    # What crosses from the trigger runner to the triggerer: a plain TaskSuccessEvent with no XComs of its own.
    seen = TypeAdapter(DiscrimatedTriggerEvent).validate_python(event.model_dump())
    assert type(seen) is TaskSuccessEvent and seen.xcoms is None
    assert xcoms == {("user_dag", "r1", "grp.wait", 3, "return_value"): {"name": "rc", "deleted": True}}


def test_run_in_line_the_payload_resumes_the_operator_as_before(xcoms) -> None:
    """dag.test() resumes the task with event.payload whatever the event's type: the operator returns the value."""
    event = fire(OneShot(SUCCESS, {"xcoms": {"return_value": 1}}), in_triggerer=False)
    assert isinstance(event, TaskEndedEvent) and event.payload == SUCCESS
    assert xcoms == {}


@pytest.mark.parametrize(
    ("payload", "end_task"),
    [
        (SUCCESS, None),  # the operator has work left after the wait
        ({"status": "failed", "message": "x", "retryable": False}, {"xcoms": {}}),
        ({"status": "timeout", "message": "x"}, {"xcoms": {}}),
        ({"status": "error", "message": "x"}, {"xcoms": {}}),
    ],
)
def test_anything_else_resumes_the_task_on_a_worker(xcoms, payload, end_task) -> None:
    event = fire(OneShot(payload, end_task))
    assert type(event) is TriggerEvent and event.payload == payload
    assert xcoms == {}


def test_xcoms_that_cannot_be_stored_resume_the_task_on_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time.xcom import XCom

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("API server unreachable")

    monkeypatch.setattr(XCom, "aset", staticmethod(broken))
    event = fire(OneShot(SUCCESS, {"xcoms": {"return_value": 1}}))
    assert type(event) is TriggerEvent and event.payload == SUCCESS


def test_a_tasks_xcoms_are_stored_at_once_not_one_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """The triggerer's supervisor answers between its own loop's database work: each XCom sent in turn
    would wait for one more of its loops, so all are sent together."""
    from airflow.sdk.execution_time.xcom import XCom

    entered: list[str] = []
    both_sent = asyncio.Event()

    async def aset(key: str, value: Any, **where: Any) -> None:
        entered.append(key)
        if len(entered) == 2:
            both_sent.set()
        await asyncio.wait_for(both_sent.wait(), 10)  # stored one after another, the first never sees the second

    monkeypatch.setattr(XCom, "aset", staticmethod(aset))
    event = fire(OneShot(SUCCESS, {"xcoms": {"return_value": 1, "work_span": [0, 1]}}))
    assert isinstance(event, TaskEndedEvent) and sorted(entered) == ["return_value", "work_span"]


def _op(task_id: str, dag: DAG, **kwargs: Any) -> Any:
    from airflow.providers.standard.operators.empty import EmptyOperator

    return EmptyOperator(task_id=task_id, dag=dag, **kwargs)


def test_a_task_that_a_mapped_task_expands_over_or_that_has_multiple_outputs_resumes_on_a_worker() -> None:
    from airflow.sdk import task

    with DAG("user_dag", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        plain = _op("plain", dag)
        quiet = _op("quiet", dag, do_xcom_push=False)
        feeds = _op("feeds", dag)

        @task
        def each(x: Any) -> None: ...

        each.expand(x=feeds.output)
    assert may_end_in_triggerer(plain) and not may_end_in_triggerer(feeds)
    assert task_end(plain, {"a": 1}) == {"xcoms": {"return_value": {"a": 1}}}
    assert task_end(quiet, {"a": 1}) == {"xcoms": {}}
    assert task_end(feeds, {"a": 1}) is None
    assert not may_end_in_triggerer(SimpleNamespace(multiple_outputs=True))


def test_a_task_with_outlets_resumes_on_a_worker_which_records_their_asset_events() -> None:
    from airflow.sdk import Asset

    with DAG("user_dag", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        publishes = _op("publishes", dag, outlets=[Asset("gs://acme/models/latest")])
    assert not may_end_in_triggerer(publishes) and task_end(publishes, {"a": 1}) is None


def test_the_end_task_travels_in_the_serialized_kwargs() -> None:
    classpath, kwargs = OneShot(SUCCESS, {"xcoms": {"k": [1, 2]}}).serialize()
    assert classpath.endswith("OneShot") and kwargs["end_task"] == {"xcoms": {"k": [1, 2]}}
    assert isinstance(kwargs, Mapping)
