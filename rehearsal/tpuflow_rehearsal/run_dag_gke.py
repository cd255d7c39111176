"""`tpuflow run DAG_FILE --backend gke`: a team's own DAG on the GKE rehearsal, as `tpuflow demo --backend gke`
runs the shipped one (tpuflow_rehearsal.demo_gke): the stand-ins started (the real control plane by default, or the
imitation), the connections and Variables of the run's Airflow home pointed at them, the DAG run with
`airflow dags test`, its summary printed, and everything stopped; anything left behind (node pools, RayClusters,
RayServices, pods, Ray processes, slice leases) fails the command with one line naming it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tpuflow_rehearsal.demo import local_output_root, max_slices_env, read_report
from tpuflow_rehearsal.demo_gke import (
    CHECKED,
    GCP_CONN_ID,
    KUBERNETES_CONN_ID,
    held_leases,
    pipeline_variables,
    ray_processes_after_stop,
    rehearsal,
)
from tpuflow_rehearsal.run_dag import RunRequest, checked_dag_id, print_outcome, run_env

WHO = "tpuflow run --backend gke"


def run_on_rehearsal(request: RunRequest) -> int:
    """The DAG on the GKE and Kubernetes stand-ins; 0 when it succeeded and left nothing behind."""
    work = request.work_dir / "gke"
    home = work / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    output_root = local_output_root(work, request.output_root)
    env = run_env(home, output_root, request.dag_file, "gke")
    dag_id = checked_dag_id(env, request, backend="gke")  # before any stand-in starts
    stack_args = argparse.Namespace(control_plane=request.control_plane, operation_seconds=request.operation_seconds)
    with rehearsal(stack_args, work, output_root, WHO) as run:
        env.update(
            {
                **run.storage_env,
                **run.stack.airflow_connections(GCP_CONN_ID, KUBERNETES_CONN_ID),
                **pipeline_variables(run.stack, output_root),
                **max_slices_env(request.num_slices),
            }
        )
        airflow = str(Path(sys.executable).with_name("airflow"))
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        leases_before = held_leases(run.lease_root)
        print(f"{WHO}: running {dag_id} for {request.run_date} with {json.dumps(request.conf)}", flush=True)
        started = time.time()
        argv = [airflow, "dags", "test", dag_id, request.run_date, "-c", json.dumps(request.conf)]
        code = subprocess.run(argv, env=env).returncode
        elapsed = time.time() - started
        report = read_report(output_root, dag_id, request.run_date) if code == 0 else None
        left = run.wait_for_teardowns(leases_before)
    left = ray_processes_after_stop(run, left)
    outcome = print_outcome(WHO, dag_id, report, elapsed)
    if left:
        print(f"{WHO}: FAILED: left behind after the run: {', '.join(left)}", file=sys.stderr)
        return 1
    print(f"{'left behind:':<20}nothing ({CHECKED})")
    return outcome
