"""A Ray job's secrets and its result line, against a scripted dashboard that runs the job the way Ray does:
the driver process gets the job's config (runtime_env and metadata) in RAY_JOB_CONFIG_JSON_ENV_VAR, as Ray's
JobSupervisor sets it; a worker process (a Ray Train worker) gets only the runtime_env's env_vars, from the
raylet, and its output reaches the job log behind Ray's "(RayTrainWorker pid=...)" prefix.

- a token given as ``worker_env`` travels in the job's runtime_env, never on its command line (which Ray's
  dashboard and the task log show), and Airflow's masker redacts it in the task log;
- a worker that prints a result-shaped line after the driver's (a forged checkpoint and a passing accuracy)
  does not replace the driver's result: the quality gate judges the driver's.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import os
import secrets
import shlex
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from airflow.sdk.exceptions import TaskDeferred
from support.workload_operators import train_operator
from tpuflow.workloads.tpuflow_driver.result import JOB_CONFIG_ENV, emit_result

from tpuflow.rayjob.operators import QualityGateError, RaySubmitJobOperator

WORKER_PREFIX = "(RayTrainWorker pid=4242, ip=10.0.0.2) "
FORGED = {"checkpoint": "gs://attacker/ckpt", "metrics": {"accuracy": 1.0}, "accuracy": 1.0}


def run_as(env: dict[str, str], code: Callable[[], None]) -> str:
    """What ``code`` prints, run with exactly the Ray-given part of the environment ``env``."""
    out = io.StringIO()
    base = {k: v for k, v in os.environ.items() if k != JOB_CONFIG_ENV}
    with mock.patch.dict(os.environ, {**base, **env}, clear=True), contextlib.redirect_stdout(out):
        code()
    return out.getvalue()


def driver_env(job: dict[str, Any]) -> dict[str, str]:
    """The driver's environment as Ray's JobSupervisor builds it: the runtime_env's env_vars and the job config."""
    config = {"runtime_env": job["runtime_env"], "metadata": job["metadata"]}
    return {**job["runtime_env"].get("env_vars", {}), JOB_CONFIG_ENV: json.dumps(config)}


def worker_env(job: dict[str, Any]) -> dict[str, str]:
    """A Ray worker's: the job's runtime_env env_vars (the raylet starts it; no job config)."""
    return dict(job["runtime_env"].get("env_vars", {}))


def driver_then_forging_worker(job: dict[str, Any]) -> str:
    """The job log: the driver's result, then a worker emitting a forged one (through tpuflow's own helper and by
    hand after a carriage return, so the forged text starts a line of the log)."""
    driver = run_as(driver_env(job), lambda: emit_result({"accuracy": 0.5, "checkpoint": "/runs/r/checkpoint_2"}))
    worker = run_as(worker_env(job), lambda: emit_result(FORGED))
    by_hand = f"step 9\rTPUFLOW_RESULT {json.dumps(FORGED)}\n"
    return "step 1\n" + driver + "".join(WORKER_PREFIX + line + "\n" for line in worker.splitlines()) + by_hand


class RayDashboard:
    """The job API of a dashboard whose jobs run ``job_log`` (the submission in, the driver log out) and end
    SUCCEEDED by the next poll."""

    dashboard_url = "http://ray.test:8265"

    def __init__(self, job_log: Callable[[dict[str, Any]], str]) -> None:
        self.job_log = job_log
        self.submitted: dict[str, dict[str, Any]] = {}
        self.status: dict[str, str] = {}
        self.logs: dict[str, str] = {}

    def find_jobs(self, prefix: str) -> list[Any]:
        return [
            SimpleNamespace(submission_id=sid, status=self.status[sid], start_time=i, metadata=job["metadata"])
            for i, (sid, job) in enumerate(self.submitted.items())
            if sid.startswith(prefix)
        ]

    def submit_job(self, **job: Any) -> str:
        sid = job["submission_id"]
        self.submitted[sid], self.status[sid] = job, "RUNNING"
        self.logs[sid] = self.job_log(job)
        return sid

    async def aget_job_info(self, sid: str) -> dict[str, Any]:
        status, self.status[sid] = self.status[sid], "SUCCEEDED"
        return {"status": status, "message": "", "runtime_env": self.submitted[sid]["runtime_env"]}

    async def aget_job_logs(self, sid: str) -> str:
        return self.logs[sid] if self.status[sid] != "RUNNING" else ""

    async def atail_job_logs(self, sid: str) -> AsyncIterator[str]:
        while self.status[sid] == "RUNNING":
            await asyncio.sleep(0.01)
        yield self.logs[sid]

    def get_job_logs(self, sid: str) -> str:
        return self.logs[sid]

    async def astop_job(self, sid: str) -> None: ...

    def stop_job(self, sid: str) -> bool:
        return True


def run_task(make: Callable[[], Any], context: dict[str, Any], dashboard: RayDashboard) -> Any:
    """The task's outcome as Airflow would reach it: a deferred trigger is rebuilt from its serialized kwargs
    (as the triggerer does) and its event handed to a fresh operator (as the resuming worker does)."""

    async def first_event(trigger: Any) -> Any:
        async for event in trigger.run():
            return event.payload

    def build() -> Any:
        op = make()
        op.hook = lambda: dashboard
        return op

    try:
        return build().execute(context)
    except TaskDeferred as deferred:
        classpath, kwargs = deferred.trigger.serialize()
        module, _, name = classpath.rpartition(".")
        trigger = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
        trigger._hook = lambda: dashboard
        return build().execute_complete(context, asyncio.run(first_event(trigger)))


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_worker_env_token_travels_in_the_runtime_env_not_the_command_line_or_the_task_log(
    fresh_context: Any, capfd: pytest.CaptureFixture[str], deferrable: bool
) -> None:
    # each path masks its own; unique, so no secret another test masked in this process is a part of it
    token = f"hub-{secrets.token_hex(8)}-{'triggerer' if deferrable else 'worker'}"

    def driver(job: dict[str, Any]) -> str:
        def train() -> None:
            emit_result({"checkpoint": "/runs/r/checkpoint_1", "has_token": os.environ.get("HF_TOKEN") == token})

        return run_as(driver_env(job), train)

    dashboard = RayDashboard(driver)
    make = lambda: train_operator(  # noqa: E731
        worker_env={"HF_TOKEN": token}, working_dir="", deferrable=deferrable, poll_interval=0.01
    )
    result = run_task(make, fresh_context(task_id="train"), dashboard)

    (job,) = dashboard.submitted.values()
    assert token not in job["entrypoint"], "the command line Ray shows as the job's name holds the token"
    out, err = capfd.readouterr()
    assert token not in out + err, "the training spec or the command line logged it"
    assert job["runtime_env"]["env_vars"]["HF_TOKEN"] == token
    argv = shlex.split(job["entrypoint"])
    spec = json.loads(argv[argv.index("--spec-json") + 1])
    assert "HF_TOKEN" not in spec["worker_env"], "the workers get it from the runtime_env"
    assert result["has_token"], "the job's processes have the token"
    # A driver line that prints the token (a library echoing its settings) reaches the task log masked: the wait
    # gave the value to Airflow's masker (and to its supervisor, which applies the mask to every line it writes).
    from airflow.sdk._shared.secrets_masker import redact

    assert redact(f"[ray job] hub login with {token}") == "[ray job] hub login with ***"


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_workers_forged_result_line_after_the_drivers_does_not_pass_the_gate(
    fresh_context: Any, deferrable: bool
) -> None:
    def task(min_result: dict[str, float] | None) -> Callable[[], RaySubmitJobOperator]:
        return lambda: RaySubmitJobOperator(
            task_id="job",
            entrypoint=["python", "-m", "acme.train"],
            cluster={"dashboard_url": RayDashboard.dashboard_url},
            working_dir="",
            deferrable=deferrable,
            poll_interval=0.01,
            min_result=min_result,
        )

    dashboard = RayDashboard(driver_then_forging_worker)
    with pytest.raises(QualityGateError, match=r"accuracy=0.5 is below the required 0.9"):
        run_task(task({"accuracy": 0.9}), fresh_context(run_id="gated"), dashboard)
    (job,) = dashboard.submitted.values()
    nonce = job["metadata"]["tpuflow_result_nonce"]
    # Ray gives the job's tasks and actors its runtime_env, never its metadata: the nonce is not in what they get.
    assert nonce not in json.dumps(job["runtime_env"]) and nonce not in job["entrypoint"]

    # Without a gate, the task's result is the driver's (what the served checkpoint and the report read); a retry
    # that re-attaches to the finished job reads the nonce back from the job's metadata and takes the same.
    context, dashboard = fresh_context(run_id="ungated"), RayDashboard(driver_then_forging_worker)
    for _try in (1, 2):
        assert run_task(task(None), context, dashboard) == {"accuracy": 0.5, "checkpoint": "/runs/r/checkpoint_2"}
    assert len(dashboard.submitted) == 1
