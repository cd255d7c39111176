"""A restarted triggerer resumes a job's driver log where the task log left off.

The Ray side is a scripted dashboard (the log grows between polls); the XCom side is the
SDK's XCom class with its comms replaced by a dict, as the triggerer would store it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from tpuflow.rayjob.triggers import LOG_CURSOR_XCOM_KEY, RayJobTrigger


class ScriptedJob:
    """aget_job_info / aget_job_logs / atail_job_logs of a job whose log gains `per_poll` lines a poll until `total`."""

    def __init__(self, total: int, per_poll: int) -> None:
        self.total, self.per_poll, self.printed = total, per_poll, 0

    async def aget_job_info(self, sid: str) -> dict[str, Any]:
        self.printed = min(self.total, self.printed + self.per_poll)
        return {"status": "SUCCEEDED" if self.printed == self.total else "RUNNING"}

    async def aget_job_logs(self, sid: str) -> str:
        return "".join(f"step {i}\n" for i in range(self.printed))

    async def atail_job_logs(self, sid: str) -> AsyncIterator[str]:
        """Ray's log tail: the log from its first character, each new part once, until the job ended."""
        sent = 0
        while True:
            logs = await self.aget_job_logs(sid)
            if len(logs) > sent:
                yield logs[sent:]
                sent = len(logs)
            elif self.printed == self.total:
                return
            await asyncio.sleep(0.005)


@pytest.fixture
def xcoms(monkeypatch: pytest.MonkeyPatch) -> dict[tuple, Any]:
    from airflow.sdk.execution_time.xcom import XCom

    store: dict[tuple, Any] = {}

    async def aset(
        key: str, value: Any, *, dag_id: str, task_id: str, run_id: str, map_index: int = -1, **_: Any
    ) -> None:
        store[(dag_id, run_id, task_id, map_index, key)] = value

    async def aget_one(
        *, key: str, dag_id: str, task_id: str, run_id: str, map_index: int | None = None, **_: Any
    ) -> Any:
        return store.get((dag_id, run_id, task_id, map_index, key))

    monkeypatch.setattr(XCom, "aset", staticmethod(aset))
    monkeypatch.setattr(XCom, "aget_one", staticmethod(aget_one))
    return store


def _deferred(kwargs: dict[str, Any], job: ScriptedJob) -> RayJobTrigger:
    trigger = RayJobTrigger(**kwargs)
    trigger.task_instance = SimpleNamespace(
        dag_id="d", run_id="r", task_id="train", map_index=-1
    )  # as the triggerer sets it
    trigger._hook = lambda: job  # type: ignore[method-assign]
    return trigger


async def _stream(trigger: RayJobTrigger, polls: int | None = None) -> Any:
    """Run the trigger; with `polls`, stop it after that many polls as a triggerer shutdown would."""
    agen = trigger.run()
    if polls is None:
        return await agen.__anext__()
    task = asyncio.ensure_future(agen.__anext__())
    await asyncio.sleep(0.05 * polls - 0.02)
    task.cancel()  # what the triggerer does to its triggers when it shuts down
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def _streamed(capfd: pytest.CaptureFixture[str]) -> list[str]:
    """The job lines the trigger wrote to the task log (Airflow's logging goes to stdout/err)."""
    out, err = capfd.readouterr()
    return [
        line.split("[ray job] ", 1)[1].split(" [")[0].strip()
        for line in (out + err).splitlines()
        if "[ray job] " in line
    ]


def test_a_restarted_trigger_streams_only_the_lines_not_yet_in_the_task_log(xcoms, capfd) -> None:
    job = ScriptedJob(total=10, per_poll=2)
    _, kwargs = RayJobTrigger(
        submission_id="tpuflow-train-1", cluster={"dashboard_url": "http://x"}, poll_interval=0.05
    ).serialize()

    asyncio.run(_stream(_deferred(kwargs, job), polls=2))  # the first triggerer goes away mid-job
    first = _streamed(capfd)
    assert first and first == [f"step {i}" for i in range(len(first))]
    assert xcoms[("d", "r", "train", -1, LOG_CURSOR_XCOM_KEY)]["submission_id"] == "tpuflow-train-1"

    event = asyncio.run(_stream(_deferred(kwargs, job)))  # a new triggerer, same serialized kwargs
    assert event.payload["status"] == "success" and event.payload["job_status"] == "SUCCEEDED"
    assert first + _streamed(capfd) == [f"step {i}" for i in range(10)], "no line lost, none repeated"


def test_a_cursor_of_another_job_is_ignored(xcoms, capfd) -> None:
    xcoms[("d", "r", "train", -1, LOG_CURSOR_XCOM_KEY)] = {"submission_id": "tpuflow-train-1", "offset": 30}
    _, kwargs = RayJobTrigger(
        submission_id="tpuflow-train-1-r1", cluster={"dashboard_url": "http://x"}, poll_interval=0.01
    ).serialize()
    asyncio.run(_stream(_deferred(kwargs, ScriptedJob(total=4, per_poll=4))))
    assert _streamed(capfd) == [f"step {i}" for i in range(4)]


def test_without_a_task_instance_the_trigger_streams_from_its_own_offset(capfd) -> None:
    trigger = RayJobTrigger(submission_id="s", cluster={"dashboard_url": "http://x"}, poll_interval=0.01)
    trigger._hook = lambda: ScriptedJob(total=3, per_poll=1)  # type: ignore[method-assign]
    assert asyncio.run(_stream(trigger)).payload["job_status"] == "SUCCEEDED"
    assert _streamed(capfd) == ["step 0", "step 1", "step 2"]
