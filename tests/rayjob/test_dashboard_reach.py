"""A try's first call to the Ray dashboard waits for a head that is starting, up to unreachable_timeout.

A kubelet that starts a Ray head's container again (its node came back) leaves the head at the same address,
answering tens of seconds later on a loaded node; a retry of the job task used to fail on its first refused
connection and burn the team's retries in seconds. The connection error is the one Ray's own
JobSubmissionClient raises for a dashboard that does not answer (a closed port here).
"""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.rayjob.operators import RaySubmitJobOperator


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refused(url: str) -> OSError:
    """What Ray's JobSubmissionClient raises for a dashboard nobody answers at."""
    with pytest.raises(OSError) as err:
        RayJobHook(cluster={"dashboard_url": url}).find_jobs("tpuflow-anything")
    return err.value


class StartingHead:
    """A dashboard that refuses ``refusals`` connections (Ray's own error), then answers with no jobs."""

    def __init__(self, url: str, refusals: int) -> None:
        self.dashboard_url, self.refusals, self.error = url, refusals, _refused(url)
        self.asked = 0
        self.submitted: list[str] = []

    def find_jobs(self, prefix: str) -> list[Any]:
        self.asked += 1
        if self.asked <= self.refusals:
            raise self.error
        return [SimpleNamespace(submission_id=s, status="RUNNING", start_time=0, metadata={}) for s in self.submitted]

    def submit_job(self, *, submission_id: str, **_: Any) -> str:
        self.submitted.append(submission_id)
        return submission_id


def _operator(head: StartingHead, **kwargs: Any) -> RaySubmitJobOperator:
    op = RaySubmitJobOperator(
        task_id="nightly_check",
        entrypoint="python check.py",
        cluster={"dashboard_url": head.dashboard_url},
        working_dir="",
        deferrable=True,
        poll_interval=0.05,
        **kwargs,
    )
    op.hook = lambda: head  # type: ignore[method-assign,assignment,return-value]
    return op


def test_a_try_waits_for_a_head_that_starts_then_submits_once(fresh_context: Any) -> None:
    head = StartingHead(f"http://127.0.0.1:{_closed_port()}", refusals=3)
    with pytest.raises(TaskDeferred):
        _operator(head, unreachable_timeout=30).execute(fresh_context(run_id="after-the-node-came-back"))
    assert head.asked == 4 and len(head.submitted) == 1


def test_a_head_that_never_answers_fails_the_try_retryably_naming_the_dashboard(fresh_context: Any) -> None:
    head = StartingHead(f"http://127.0.0.1:{_closed_port()}", refusals=10**6)
    with pytest.raises(AirflowException) as err:
        _operator(head, unreachable_timeout=0.3).execute(fresh_context(run_id="head-gone"))
    assert not isinstance(err.value, AirflowFailException), "a later try may find the head"
    message = str(err.value)
    assert head.dashboard_url in message and "has not answered for" in message and "\n" not in message
    assert head.asked >= 2 and head.submitted == []
