"""`tpuflow demo --backend gke`: the GKE pipeline end to end on the GKE and Kubernetes stand-ins.

Starts the stand-ins (tpuflow.dev.standins.stack: the GKE API, the Kubernetes API, the simulated KubeRay
operator with real local Ray clusters behind it), points the Airflow connections and Variables of a
throw-away Airflow home at them, runs ``tpu_llm_pipeline_gke`` with ``airflow dags test``, prints the
result, waits for the teardown tasks' deletions to finish, stops everything and says what, if anything,
was left behind (node pools, Kubernetes objects, Ray processes).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from tpuflow.errors import UserInputError

DAG_ID = "tpu_llm_pipeline_gke"
GCP_CONN_ID = "gke_standin"
KUBERNETES_CONN_ID = "kube_standin"
TEARDOWN_WAIT_S = 180.0


def pipeline_variables(stack: Any, output_root: str) -> dict[str, str]:
    """AIRFLOW_VAR_* that point tpu_llm_pipeline_gke at the stand-ins (tpuflow.pipeline.gke.variable_settings)."""
    from tpuflow import workloads_dir

    variables = {
        "tpuflow_gcp_conn_id": GCP_CONN_ID,  # the project comes from this connection's extra
        "tpuflow_kubernetes_conn_id": KUBERNETES_CONN_ID,
        "tpuflow_gke_location": stack.zone,
        "tpuflow_gke_cluster": stack.cluster,
        # The stand-in's Ray clusters run on this machine, not in the image: Serve finds workloads/ here.
        "tpuflow_serve_workloads_uri": f"local://{workloads_dir()}",
        "tpuflow_gke_output_root": output_root,
    }
    return {f"AIRFLOW_VAR_{name.upper()}": value for name, value in variables.items()}


def _leftovers(stack: Any) -> list[str]:
    from tpuflow.dev.standins.kubernetes_api import PODS, RAYCLUSTERS, RAYSERVICES

    out = [f"node pool {p['name']}" for p in stack.gke.node_pools()]
    for rtype in (RAYSERVICES, RAYCLUSTERS, PODS):
        out += [f"{rtype.kind} {o['metadata']['name']}" for o in stack.kube.store.list(rtype)]
    return out


def run_gke(args: argparse.Namespace, conf: dict[str, Any]) -> int:
    """``conf``: the run's conf, already checked (tpuflow.dev.demo.demo_conf)."""
    from tpuflow.dev.demo import _storage, demo_env
    from tpuflow.dev.ray_launcher import LocalRayLauncher
    from tpuflow.dev.standins.kuberay_controller.seams import LaunchSpec, RayClusterHandle
    from tpuflow.dev.standins.stack import StandinStack

    if args.keep_endpoint:
        raise UserInputError(
            "--keep-endpoint",
            True,
            "the GKE stand-ins stop with the demo; keep an endpoint with `tpuflow standins up` and your own DAG run",
        )
    work = Path(args.work_dir).resolve() / "gke"
    home = work / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    output_root = (args.output_root or str(work / "outputs")).rstrip("/")
    if "://" not in output_root and not output_root.startswith("gs:"):
        output_root = str(Path(output_root).resolve())

    started_clusters: list[Any] = []

    class RecordingLauncher(LocalRayLauncher):
        def launch(self, spec: LaunchSpec) -> RayClusterHandle:
            handle = super().launch(spec)
            started_clusters.append(handle.cluster)  # type: ignore[attr-defined]
            return handle

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the stand-ins and their Ray clusters as Ctrl-C does

    signal.signal(signal.SIGTERM, interrupted)
    stack = StandinStack(
        work / "standins",
        operation_seconds=args.operation_seconds,
        launcher=RecordingLauncher(work / "standins" / "ray-clusters", head_cpus=2, host_cpus=1, timeout=600),
    )
    print(f"tpuflow demo --backend gke: starting the GKE and Kubernetes stand-ins in {stack.workdir}", flush=True)
    started = time.time()
    with _storage(output_root) as storage_env, stack:
        print(
            f"  GKE API {stack.gke.url}, Kubernetes API {stack.kube.api.url} (kubeconfig {stack.kube.kubeconfig_path})"
        )
        env = {
            **demo_env(home, output_root),
            **storage_env,
            **stack.airflow_connections(GCP_CONN_ID, KUBERNETES_CONN_ID),
            **pipeline_variables(stack, output_root),
        }
        airflow = str(Path(sys.executable).with_name("airflow"))
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        conf = {**conf, "keep_endpoint": False}
        if not conf.get("serve_topology"):
            conf.pop("serve_topology", None)
        run_date = args.date or date.today().isoformat()
        print(f"tpuflow demo: running {DAG_ID} for {run_date} with {json.dumps(conf)}", flush=True)
        proc = subprocess.run([airflow, "dags", "test", DAG_ID, run_date, "-c", json.dumps(conf)], env=env)
        elapsed = time.time() - started
        report = _report(output_root, run_date) if proc.returncode == 0 else None
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while _leftovers(stack) and time.monotonic() < deadline:
            time.sleep(0.5)  # the RayService's own RayCluster is collected after the RayService
        left = _leftovers(stack)
    left += [f"Ray cluster {c.name} (processes still alive)" for c in started_clusters if c.is_alive()]
    total = time.time() - started
    leftover = ", ".join(left) if left else "nothing (node pools, RayClusters, RayServices, pods, Ray processes)"
    if report is None:
        print(
            f"\ntpuflow demo: the GKE pipeline FAILED after {elapsed:.0f}s (see the task logs above)", file=sys.stderr
        )
        print(f"left behind when the stand-ins stopped: {leftover}", file=sys.stderr)
        return 1
    print(f"\n=== tpuflow demo --backend gke: pipeline succeeded in {elapsed:.0f}s ({total:.0f}s with stand-ins) ===")
    print(f"outputs:            {report['output_dir']}")
    print(f"held-out accuracy:  {report['accuracy']:.3f} on {report['heldout_examples']} problems")
    print(f"sample completion:  {report['sample_prompt']!r} -> {report['sample_completion']!r}")
    for key in ("chip_hours", "ledger"):
        if key in report:
            print(f"{key.replace('_', ' ') + ':':<20}{json.dumps(report[key])}")
    print(f"Ray clusters run:   {len(started_clusters)} (CPU prep cluster, training slice, RayService)")
    print(f"left behind:        {leftover}")
    return 0 if not left else 1


def _report(output_root: str, run_date: str) -> dict[str, Any] | None:
    from tpuflow.storage import read_text

    text = read_text(f"{output_root}/{DAG_ID}/{run_date}/report.json")
    return json.loads(text) if text else None
