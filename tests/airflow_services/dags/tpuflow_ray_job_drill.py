"""Test-only Airflow DAG: one deferred Ray job on the cluster named in the run's conf.

Loaded only by the real-Airflow tests, which start a small local Ray cluster and trigger
this DAG with its connection info, then kill things around the deferred job.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from tpuflow.rayjob.operators import RaySubmitJobOperator

# tests/rayjob/jobs/counter.py: prints "step i" every `delay` seconds, then its result
JOBS = Path(__file__).resolve().parents[2] / "rayjob" / "jobs"

with DAG(
    dag_id="tpuflow_ray_job_drill",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,
    params={
        "cluster": Param({}, type="object", description="connection info of a running local Ray cluster"),
        "steps": Param(60, type="integer", minimum=1),
        "delay": Param(0.5, type="number", minimum=0),
        "outcome": Param("ok", enum=["ok", "fail"]),
    },
    tags=["tpuflow-tests"],
):
    RaySubmitJobOperator(
        task_id="long_job",
        entrypoint="python counter.py {{ params.steps }} {{ params.delay }} {{ params.outcome }}",
        retries=1,  # a retryable failure would show as try 2 within seconds; a user-code error must not retry
        retry_delay=timedelta(seconds=2),
        cluster="{{ params.cluster }}",
        working_dir=str(JOBS),
        poll_interval=1.0,
    )
