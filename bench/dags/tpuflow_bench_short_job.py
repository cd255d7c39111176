"""Bench-only DAG: one short deferred Ray job on the cluster named in the run's conf, running until the
conf's end_at when it has one.

Loaded only by `python -m bench` (job_end_to_task_end_p95_s), which starts a real local Airflow whose
DAGs folder holds this file, triggers it many times and compares each Ray job's end time with the
end of its Airflow task.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from tpuflow.rayjob.operators import RaySubmitJobOperator

JOBS = Path(__file__).resolve().parents[1] / "jobs"

with DAG(
    dag_id="tpuflow_bench_short_job",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,
    max_active_runs=32,
    params={
        "cluster": Param({}, type="object", description="connection info of a running local Ray cluster"),
        "end_at": Param(0, type="number", description="epoch seconds the job runs until (0: two seconds)"),
    },
    tags=["tpuflow-bench"],
):
    RaySubmitJobOperator(
        task_id="short_job",
        entrypoint="python ticker.py 2 0.5 {{ run_id }} {{ params.end_at }}",
        cluster="{{ params.cluster }}",
        working_dir=str(JOBS),
    )
