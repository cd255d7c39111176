"""RaySubmitJobOperator on the embedded cluster: result, streamed logs, re-attach, resubmit, gates."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.rayjob.operators import QualityGateError, RaySubmitJobOperator
from tpuflow.rayjob.triggers import RayJobTrigger

JOBS = Path(__file__).parent / "jobs"

pytestmark = pytest.mark.slow


def operator(cluster, args: str, **kwargs) -> RaySubmitJobOperator:
    """tests/rayjob/jobs/counter.py ARGS as a job: not deferrable, polling every 0.5 s, unless kwargs say otherwise."""
    return RaySubmitJobOperator(
        task_id="job",
        entrypoint=f"python counter.py {args}",
        cluster=cluster.connection_info(),
        working_dir=str(JOBS),
        **{"deferrable": False, "poll_interval": 0.5, **kwargs},
    )


def jobs_of(cluster, op, context) -> list:
    return RayJobHook(cluster=cluster.connection_info()).find_jobs(op.base_submission_id(context))


def streamed_lines(capfd) -> list[str]:
    """Task-log lines the operator/trigger wrote for the job's driver output (Airflow logs to stdout/err)."""
    out, err = capfd.readouterr()
    return [
        line.split("[ray job] ", 1)[1].split(" [")[0].strip()
        for line in (out + err).splitlines()
        if "[ray job] " in line
    ]


def test_result_returned_and_log_streamed_and_kept(slice_cluster, fresh_context, capfd, tmp_path):
    ctx = fresh_context()
    op = operator(slice_cluster, "3 0.3 ok", log_uri=str(tmp_path / "logs" / "job.log"))
    result = op.execute(ctx)
    assert result == {"steps": 3, "accuracy": 0.5}
    streamed = streamed_lines(capfd)
    assert "step 0" in streamed and "step 2" in streamed
    assert "step 2" in (tmp_path / "logs" / "job.log").read_text()
    assert ctx["ti"].xcoms["ray_job_log"].startswith("file://")
    assert ctx["ti"].xcoms["ray_job"].endswith(op.base_submission_id(ctx))


def test_retry_returns_the_succeeded_job_without_rerunning(slice_cluster, fresh_context):
    ctx = fresh_context()
    first = operator(slice_cluster, "1 0.1 ok")
    assert first.execute(ctx)["steps"] == 1
    ctx["ti"].try_number = 2
    again = operator(slice_cluster, "1 0.1 ok")
    assert again.execute(ctx)["steps"] == 1
    assert len(jobs_of(slice_cluster, again, ctx)) == 1


def test_user_code_error_fails_at_once_with_traceback_and_a_rerun_resubmits(slice_cluster, fresh_context):
    ctx = fresh_context()
    op = operator(slice_cluster, "2 0.1 fail")
    # AirflowFailException: Airflow does not retry it.
    with pytest.raises(AirflowFailException) as err:
        op.execute(ctx)
    assert "ended FAILED" in str(err.value) and "ValueError: the user's code is broken" in str(err.value)
    # A user clearing the task (a new try) gets a new job, not the failed one's result.
    with pytest.raises(AirflowFailException):
        operator(slice_cluster, "2 0.1 fail").execute(ctx)
    ids = [j.submission_id for j in jobs_of(slice_cluster, op, ctx)]
    base = op.base_submission_id(ctx)
    assert ids == [base, f"{base}-r1"]
    assert ctx["task_state_store"]["ray_submission_id"] == f"{base}-r1", "the task state store names the current job"


def test_a_retry_follows_the_job_named_in_the_task_state_store(slice_cluster, fresh_context):
    ctx = fresh_context()
    first = operator(slice_cluster, "1 0.1 ok")
    assert first.execute(ctx)["steps"] == 1
    base = first.base_submission_id(ctx)
    assert ctx["task_state_store"]["ray_submission_id"] == base
    # A store naming a job that is gone (e.g. the cluster was recreated) falls back to the search.
    ctx["task_state_store"]["ray_submission_id"] = f"{base}-r7"
    assert operator(slice_cluster, "1 0.1 ok").execute(ctx)["steps"] == 1
    assert ctx["task_state_store"]["ray_submission_id"] == base
    assert len(jobs_of(slice_cluster, first, ctx)) == 1


def test_quality_gate_fails_without_retry(slice_cluster, fresh_context):
    op = operator(slice_cluster, "1 0.1 ok", min_result={"accuracy": 0.9})
    with pytest.raises(QualityGateError, match="accuracy=0.5 is below the required 0.9"):
        op.execute(fresh_context())


def test_trigger_reattaches_to_a_running_job_and_streams_until_done(slice_cluster, fresh_context, capfd):
    ctx = fresh_context()
    op = operator(slice_cluster, "4 0.5 ok", deferrable=True)
    hook = op.hook()
    sid, status, _, nonce = op._attach_or_submit(hook, op.base_submission_id(ctx), ctx)
    # A second try of the same task finds the running job instead of submitting another.
    sid_again, _, reattached, nonce_again = op._attach_or_submit(hook, op.base_submission_id(ctx), ctx)
    assert sid_again == sid and reattached and len(jobs_of(slice_cluster, op, ctx)) == 1
    assert nonce and nonce_again == nonce  # the re-attached try reads the job's nonce back from its metadata
    trigger = RayJobTrigger(
        submission_id=sid, cluster=slice_cluster.connection_info(), poll_interval=0.3, result_nonce=nonce
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "tpuflow.rayjob.triggers.RayJobTrigger"
    rebuilt = RayJobTrigger(**kwargs)

    async def first_event():
        async for event in rebuilt.run():
            return event.payload

    capfd.readouterr()
    payload = asyncio.run(first_event())
    assert payload["status"] == "success" and payload["job_status"] == "SUCCEEDED" and payload["result"]["steps"] == 4
    assert [line for line in streamed_lines(capfd) if line.startswith("step")] == [f"step {i}" for i in range(4)]
    assert op.execute_complete(ctx, payload)["steps"] == 4


def test_trigger_on_kill_stops_the_job(slice_cluster, fresh_context):
    ctx = fresh_context()
    op = operator(slice_cluster, "200 0.5 ok", deferrable=True)
    hook = op.hook()
    sid, _, _, _ = op._attach_or_submit(hook, op.base_submission_id(ctx), ctx)
    trigger = RayJobTrigger(submission_id=sid, cluster=slice_cluster.connection_info())
    asyncio.run(trigger.on_kill())
    import time

    deadline = time.time() + 10
    while hook.get_job_status(sid) != "STOPPED" and time.time() < deadline:
        time.sleep(0.5)
    assert hook.get_job_status(sid) == "STOPPED"


def test_a_reattached_job_stopped_by_an_earlier_kill_is_replaced_once(slice_cluster, fresh_context):
    """A cleared task's new try can re-attach to the old job while the kill is still stopping it:
    when that job ends STOPPED the try submits a fresh one instead of failing. A job the try itself
    submitted and that gets stopped fails the task."""
    import threading

    ctx = fresh_context()
    first = operator(slice_cluster, "400 0.5 ok")
    hook = first.hook()
    base, _, reattached, _ = first._attach_or_submit(hook, first.base_submission_id(ctx), ctx)
    assert not reattached
    threading.Timer(3.0, hook.stop_job, args=(base,)).start()  # the earlier try's kill, landing late
    result = operator(slice_cluster, "2 0.1 ok").execute(ctx)  # the new try re-attaches, then replaces
    assert result["steps"] == 2
    assert [j.submission_id for j in jobs_of(slice_cluster, first, ctx)] == [base, f"{base}-r1"]

    ctx = fresh_context()
    own = operator(slice_cluster, "400 0.5 ok")
    threading.Timer(3.0, lambda: hook.stop_job(own.base_submission_id(ctx))).start()
    with pytest.raises(Exception, match="ended STOPPED"):
        own.execute(ctx)
    assert len(jobs_of(slice_cluster, own, ctx)) == 1


def test_a_workers_forged_result_line_after_the_drivers_is_not_the_result(slice_cluster, fresh_context, tmp_path):
    """On a real cluster: the job's worker sees the runtime_env's variables but neither the job config nor the
    result nonce; its result-shaped lines, forwarded into the driver log after the driver's, are not the result."""
    log = tmp_path / "job.log"
    op = RaySubmitJobOperator(
        task_id="job",
        entrypoint=["python", "forged_result.py"],
        cluster=slice_cluster.connection_info(),
        working_dir=str(JOBS),
        env_vars={"HF_TOKEN": "sekrit"},
        log_uri=str(log),
        deferrable=False,
        poll_interval=0.5,
    )
    assert op.execute(fresh_context()) == {
        "accuracy": 0.5,
        "driver_has_nonce": True,
        "worker_has_nonce": False,
        "worker_has_job_config": False,
        "worker_has_runtime_env_var": True,
    }
    lines = log.read_text().splitlines()
    driver = next(i for i, line in enumerate(lines) if "driver_has_nonce" in line)
    # Ray's forwarding turns the worker's carriage return into a line break: that forged line starts a line of
    # the driver log, no "(forge pid=...)" prefix in front of it; only the nonce tells it from the driver's.
    forged = [i for i, line in enumerate(lines) if '"steps": 999' in line]
    assert len(forged) == 2 and all(i > driver for i in forged), lines[driver:]
