"""Test-only DAG: hold a slice lease for a few seconds per run, so a backfill shows whether runs overlap.

Loaded only by the real-Airflow tests (their DAGs folder adds it beside the project's DAGs).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from tpuflow.slices.operators import TPUAcquireSliceOperator, TPUReleaseSliceOperator

LEASES = os.environ.get("TPUFLOW_PROBE_LEASES", "/tmp/tpuflow-probe-leases")


@task
def hold(**context):
    import json
    import time
    from pathlib import Path

    start = time.time()
    time.sleep(4)
    record = {"run_id": context["run_id"], "start": start, "end": time.time()}
    out = Path(LEASES).parent / "probe-holds"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{context['ti'].run_id.replace(':', '_')}.json").write_text(json.dumps(record))
    return record


with DAG(
    dag_id="tpuflow_slice_lease_probe",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    tags=["tpuflow", "test"],
) as dag:
    acquire = TPUAcquireSliceOperator(task_id="acquire_slice", lease_root=LEASES, max_slices=1, poll_interval=1.0)
    release = TPUReleaseSliceOperator(task_id="release_slice", lease_root=LEASES)
    acquire >> hold() >> release
    release.as_teardown(setups=acquire)
