"""Test-only DAG: a local Ray cluster, a pause, then a Ray job on that cluster, then its teardown.

Loaded only by the real-Airflow tests: while the run pauses, a plain user rewrites the start task's XCom through
the REST API (tests/airflow_services/test_real_airflow.py), and the job must refuse the cluster it now names.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param, task

from tpuflow.local.operators import LocalRayCreateClusterOperator, LocalRayDeleteClusterOperator
from tpuflow.rayjob.operators import RaySubmitJobOperator


@task
def pause(go_file: str) -> None:
    """Waits (at most 10 minutes) until the test writes ``go_file``."""
    deadline = time.time() + 600
    while not Path(go_file).exists() and time.time() < deadline:
        time.sleep(1)


with DAG(
    dag_id="tpuflow_xcom_probe",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,
    params={"go_file": Param("/nonexistent", type="string")},
    tags=["tpuflow-tests"],
):
    start = LocalRayCreateClusterOperator(
        task_id="start_cluster", tpu_slice={"accelerator": "v6e", "topology": "2x2"}, head_cpus=1
    )
    job = RaySubmitJobOperator(
        task_id="job", cluster=start.output, entrypoint="python -c 'print(42)'", retries=0, poll_interval=1.0
    )
    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output)
    start >> pause("{{ params.go_file }}") >> job >> stop.as_teardown(setups=start)
