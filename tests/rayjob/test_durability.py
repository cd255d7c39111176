"""The Airflow task process dies while its Ray job runs; the rerun re-attaches instead of paying twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.airflow_context import task_context

from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.rayjob.operators import RaySubmitJobOperator

pytestmark = pytest.mark.slow
JOBS = Path(__file__).parent / "jobs"

RUN_TASK = textwrap.dedent(
    """
    import json, sys
    from tpuflow.rayjob.operators import RaySubmitJobOperator

    class TI:  # this script runs in a fresh interpreter from tmp_path: its own task-instance double
        dag_id, run_id, task_id, map_index, try_number = "durability", sys.argv[2], "train", -1, int(sys.argv[3])
        def xcom_push(self, key, value): pass

    op = RaySubmitJobOperator(task_id="train", entrypoint="python counter.py 12 0.5 ok", cluster=json.loads(sys.argv[1]),
                              working_dir=sys.argv[4], deferrable=False, poll_interval=0.5)
    print("RESULT " + json.dumps(op.execute({"ti": TI()})), flush=True)
    """
)


def test_killed_task_process_reattaches_to_its_job(slice_cluster, tmp_path):
    info = json.dumps(slice_cluster.connection_info())
    run_id = f"run-{time.time():.0f}"
    script = tmp_path / "run_task.py"
    script.write_text(RUN_TASK)
    first = subprocess.Popen(
        [sys.executable, str(script), info, run_id, "1", str(JOBS)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    hook = RayJobHook(cluster=slice_cluster.connection_info())
    probe = RaySubmitJobOperator(task_id="train", entrypoint="x", cluster=slice_cluster.connection_info())

    base = probe.base_submission_id(task_context(dag_id="durability", run_id=run_id, task_id="train"))
    deadline = time.time() + 120
    while time.time() < deadline and not (hook.find_jobs(base) and "step 2" in hook.get_job_logs(base)):
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # the worker running the task dies, the job does not
    first.wait(timeout=30)
    assert hook.get_job_status(base) in ("RUNNING", "PENDING")

    second = subprocess.run(
        [sys.executable, str(script), info, run_id, "2", str(JOBS)], capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stderr[-3000:]
    # the task's own log lines may go to stdout too (Airflow's logging config decides), so take
    # the line the script printed, not the first mention of a result
    printed = [line for line in second.stdout.splitlines() if line.startswith("RESULT ")]
    assert printed, second.stdout[-3000:]
    result = json.loads(printed[-1].removeprefix("RESULT "))
    assert result == {"steps": 12, "accuracy": 0.5}
    assert [j.submission_id for j in hook.find_jobs(base)] == [base], "exactly one job for the task"
