"""`tpuflow run DAG_FILE --backend gke`: a team's own DAG on the GKE rehearsal, as `tpuflow demo --backend gke`
runs the shipped one (tpuflow.dev.demo_gke): the stand-ins started (the real control plane by default, or the
imitation), the connections and Variables of the run's Airflow home pointed at them, the DAG run with
`airflow dags test`, its summary printed, and everything stopped; anything left behind (node pools, RayClusters,
RayServices, pods, Ray processes, slice leases) fails the command with one line naming it.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tpuflow.dev.demo import local_output_root, max_slices_env, read_report
from tpuflow.dev.demo_env import demo_storage
from tpuflow.dev.demo_gke import (
    CHECKED,
    GCP_CONN_ID,
    KUBERNETES_CONN_ID,
    TEARDOWN_WAIT_S,
    _stack,
    held_leases,
    leftovers,
    pipeline_variables,
    ray_process_leftovers,
)
from tpuflow.dev.ray_launcher import LocalRayLauncher
from tpuflow.dev.run_dag import RunRequest, checked_dag_id, print_outcome, run_env
from tpuflow.dev.standins.kuberay_controller.seams import LaunchSpec, RayClusterHandle

if TYPE_CHECKING:
    from tpuflow.local.cluster import LocalRayCluster

WHO = "tpuflow run --backend gke"


def run_on_rehearsal(request: RunRequest) -> int:
    """The DAG on the GKE and Kubernetes stand-ins; 0 when it succeeded and left nothing behind."""
    work = request.work_dir / "gke"
    home = work / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    output_root = local_output_root(work, request.output_root)
    env = run_env(home, output_root, request.dag_file, "gke")
    dag_id = checked_dag_id(env, request, backend="gke")  # before any stand-in starts
    started_clusters: list[LocalRayCluster] = []

    class RecordingLauncher(LocalRayLauncher):
        def launch(self, spec: LaunchSpec) -> RayClusterHandle:
            handle = super().launch(spec)
            started_clusters.append(handle.cluster)  # type: ignore[attr-defined]
            return handle

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the stand-ins and their Ray clusters as Ctrl-C does

    signal.signal(signal.SIGTERM, interrupted)
    stack_args = argparse.Namespace(control_plane=request.control_plane, operation_seconds=request.operation_seconds)
    with demo_storage(output_root) as storage_env, _stack(stack_args, work, storage_env, RecordingLauncher) as stack:
        print(f"  GKE API {stack.gke.url}, Kubernetes API {stack.kubernetes_url} (kubeconfig {stack.kubeconfig_path})")
        env.update(
            {
                **storage_env,
                **stack.airflow_connections(GCP_CONN_ID, KUBERNETES_CONN_ID),
                **pipeline_variables(stack, output_root),
                **max_slices_env(request.num_slices),
            }
        )
        airflow = str(Path(sys.executable).with_name("airflow"))
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        leases_before = held_leases()
        print(f"{WHO}: running {dag_id} for {request.run_date} with {json.dumps(request.conf)}", flush=True)
        started = time.time()
        argv = [airflow, "dags", "test", dag_id, request.run_date, "-c", json.dumps(request.conf)]
        code = subprocess.run(argv, env=env).returncode
        elapsed = time.time() - started
        report = read_report(output_root, dag_id, request.run_date) if code == 0 else None
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        # the RayService's own RayCluster is collected after the RayService, a workload policy after its pool
        while leftovers(stack, started_clusters, leases_before) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = leftovers(stack, started_clusters, leases_before)
    # stopping the stand-ins stops every Ray cluster they still run: none may outlive them
    left += [item for item in ray_process_leftovers(started_clusters) if item not in left]
    outcome = print_outcome(WHO, dag_id, report, elapsed)
    if left:
        print(f"{WHO}: FAILED: left behind after the run: {', '.join(left)}", file=sys.stderr)
        return 1
    print(f"{'left behind:':<20}nothing ({CHECKED})")
    return outcome
