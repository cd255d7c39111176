"""One wait, one outcome: the worker's path and the deferred path end in the same execute_complete.

A scripted Ray job API stands in for the dashboard (no Ray cluster); the operator runs once without
deferring and once deferred (its trigger rebuilt from its serialized kwargs, as the triggerer does,
and the event handed to a fresh operator's execute_complete, as the worker that resumes does).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from support.workload_operators import train_operator

from tpuflow.errors import UserInputError
from tpuflow.rayjob.operators import QualityGateError, RaySubmitJobOperator

TRACEBACK = 'Traceback (most recent call last):\n  File "job.py", line 3\nValueError: the user\'s code is broken\n'
# The driver's result line: <nonce> stands for the nonce the operator put in the job's metadata.
RESULT = 'TPUFLOW_RESULT <nonce> {"steps": 2, "accuracy": 0.5}\n'


class ScriptedJobs:
    """The job API of a dashboard whose jobs run for one poll, then end `final` with `logs`."""

    dashboard_url = "http://ray.test:8265"

    def __init__(self, final: str, logs: str, message: str = "") -> None:
        self.final, self.logs, self.message = final, logs, message
        self.jobs: dict[str, str] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        self.stopped: list[str] = []

    def find_jobs(self, prefix: str) -> list[Any]:
        return [
            SimpleNamespace(submission_id=sid, status=status, start_time=i, metadata=self.metadata.get(sid, {}))
            for i, (sid, status) in enumerate(self.jobs.items())
            if sid.startswith(prefix)
        ]

    def submit_job(self, *, entrypoint: str, submission_id: str, metadata: dict[str, str], **_: Any) -> str:
        self.jobs[submission_id] = "RUNNING"
        self.metadata[submission_id] = dict(metadata)
        return submission_id

    def _log(self, sid: str, text: str) -> str:
        """``text`` as the job's driver wrote it: with the nonce Ray handed it in its metadata."""
        return text.replace("<nonce>", self.metadata.get(sid, {}).get("tpuflow_result_nonce", ""))

    async def aget_job_info(self, sid: str) -> dict[str, Any]:
        status = self.jobs[sid]
        self.jobs[sid] = self.final  # it ends by the next poll
        return {"status": status, "message": self.message}

    async def aget_job_logs(self, sid: str) -> str:
        return "step 0\n" + (self._log(sid, self.logs) if self.jobs[sid] != "RUNNING" else "")

    async def atail_job_logs(self, sid: str) -> AsyncIterator[str]:
        yield "step 0\n"
        while self.jobs[sid] == "RUNNING":
            await asyncio.sleep(0.01)
        yield self._log(sid, self.logs)

    def get_job_logs(self, sid: str) -> str:
        return "step 0\n" + self._log(sid, self.logs)

    async def astop_job(self, sid: str) -> None:
        self.stopped.append(sid)

    def stop_job(self, sid: str) -> bool:
        self.stopped.append(sid)
        return True


def _run(jobs: ScriptedJobs, context: dict[str, Any], deferrable: bool, **kwargs: Any) -> tuple[str, Any]:
    """The task's outcome: ("result", value) or (exception class name, message). Deferred, every
    trigger is rebuilt from its serialized kwargs and its event goes to a fresh operator."""

    def make() -> RaySubmitJobOperator:
        op = RaySubmitJobOperator(
            task_id="job",
            entrypoint="python job.py",
            cluster={"dashboard_url": jobs.dashboard_url},
            working_dir="",
            deferrable=deferrable,
            poll_interval=0.01,
            **kwargs,
        )
        op.hook = lambda: jobs  # type: ignore[method-assign]
        return op

    async def first_event(trigger: Any) -> Any:
        async for event in trigger.run():
            return event.payload

    step = lambda: make().execute(context)  # noqa: E731
    try:
        for _ in range(3):
            try:
                return "result", step()
            except TaskDeferred as deferred:
                classpath, trigger_kwargs = deferred.trigger.serialize()
                module, _, name = classpath.rpartition(".")
                trigger = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(trigger_kwargs)))
                trigger._hook = lambda: jobs
                payload = asyncio.run(first_event(trigger))
                step = lambda payload=payload: make().execute_complete(context, payload)  # noqa: E731
        raise AssertionError("deferred more than twice")
    except AirflowException as err:
        return type(err).__name__, str(err)


@pytest.mark.parametrize(
    ("final", "logs", "kwargs", "expected"),
    [
        ("SUCCEEDED", RESULT, {}, None),
        ("FAILED", TRACEBACK, {}, AirflowFailException),  # the user's code: no retry
        ("FAILED", "ray.exceptions.NodeDiedError: node 3 has been marked dead\n", {}, AirflowException),
        ("STOPPED", "", {}, AirflowException),
        ("SUCCEEDED", RESULT, {"min_result": {"accuracy": 0.9}}, QualityGateError),
    ],
)
def test_the_worker_and_the_deferred_path_reach_the_same_outcome(
    fresh_context, tmp_path: Path, final, logs, kwargs, expected
) -> None:
    outcomes = {}
    for deferrable in (False, True):
        log_uri = tmp_path / f"deferrable-{deferrable}" / "job.log"
        jobs = ScriptedJobs(final, logs, message="Job entrypoint command failed" if final == "FAILED" else "")
        context = fresh_context(run_id="same-run")
        outcomes[deferrable] = _run(jobs, context, deferrable, log_uri=str(log_uri), **kwargs)
        kept = jobs._log(next(iter(jobs.jobs)), logs)
        assert kept in log_uri.read_text(), "the driver log is kept whatever the outcome"
        assert context["task_state_store"]["ray_submission_id"] == next(iter(jobs.jobs))
    assert outcomes[False] == outcomes[True]
    kind, value = outcomes[False]
    if expected is None:
        assert kind == "result" and value == {"steps": 2, "accuracy": 0.5}
    else:
        assert kind == expected.__name__
    if final == "FAILED":
        assert "ended FAILED" in value and logs.strip().splitlines()[-1] in value


def test_a_reattached_job_that_ends_stopped_is_replaced_on_both_paths(fresh_context) -> None:
    outcomes = {}
    for deferrable in (False, True):
        jobs = ScriptedJobs("STOPPED", "")
        context = fresh_context(run_id="same-run")
        base = RaySubmitJobOperator(
            task_id="job", entrypoint="x", cluster={"dashboard_url": "http://x"}, working_dir=""
        ).base_submission_id(context)
        jobs.jobs[base] = "RUNNING"  # an earlier try's job, which that try's kill is stopping
        submit = jobs.submit_job

        def then_succeed(*, _jobs: ScriptedJobs = jobs, _submit: Any = submit, **kw: Any) -> str:
            _jobs.final, _jobs.logs = "SUCCEEDED", RESULT  # the fresh job succeeds
            return _submit(**kw)

        jobs.submit_job = then_succeed  # type: ignore[method-assign]
        outcomes[deferrable] = _run(jobs, context, deferrable)
        assert list(jobs.jobs) == [base, f"{base}-r1"]
    assert outcomes[False] == outcomes[True] == ("result", {"steps": 2, "accuracy": 0.5})


def test_a_templated_argument_is_checked_once_rendered(fresh_context) -> None:
    # A plain bad value fails when the DAG file is parsed ...
    with pytest.raises(UserInputError) as err:
        RaySubmitJobOperator(task_id="job", entrypoint="python job.py", cluster="start_cluster")
    assert err.value.field == "cluster"
    with pytest.raises(UserInputError) as err:
        train_operator(framework="tf")
    assert err.value.field == "framework"

    # ... a template only once rendered, at the start of execute, before the cluster is asked anything.
    for kwargs, field in (
        ({"cluster": "{{ params.cluster }}"}, "cluster"),  # a dict rendered as text
        (
            {"cluster": {"dashboard_url": "http://x"}, "min_result": {"accuracy": "{{ params.threshold }}"}},
            "min_result[accuracy]",
        ),
    ):
        op = RaySubmitJobOperator(task_id="job", entrypoint="python job.py", **kwargs)
        op.hook = lambda: pytest.fail("the cluster must not be contacted with a bad argument")  # type: ignore[method-assign]
        op.render_template_fields({"params": {"cluster": {"dashboard_url": "http://x"}, "threshold": "high"}})
        with pytest.raises(UserInputError) as err:
            op.execute(fresh_context())
        assert err.value.field == field

    train = train_operator(framework="{{ params.framework }}")
    train.hook = lambda: pytest.fail("the cluster must not be contacted with a bad argument")  # type: ignore[method-assign]
    train.render_template_fields({"params": {"framework": "tf"}})
    with pytest.raises(UserInputError) as err:
        train.execute(fresh_context())
    assert err.value.field == "framework"
