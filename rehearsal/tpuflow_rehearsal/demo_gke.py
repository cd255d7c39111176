"""`tpuflow demo --backend gke`: the GKE pipeline end to end on the GKE and Kubernetes stand-ins.

Starts the stand-ins (tpuflow_rehearsal.standins.stack: the GKE API, the Kubernetes API, the simulated KubeRay
operator with real local Ray clusters behind it), points the Airflow connections and Variables of a
throw-away Airflow home at them, runs ``tpu_llm_pipeline_gke`` with ``airflow dags test``, prints the
result, waits for the teardown tasks' deletions to finish, stops everything and says what, if anything,
was left behind (``leftovers``): node pools, workload policies, RayClusters, RayServices, ProvisioningRequests,
pods, the Ray processes its launcher started, and slice leases the run took. Anything left fails the command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuflow import workloads_dir
from tpuflow.cost.goodput import ledger_lines
from tpuflow.errors import UserInputError
from tpuflow.paths import gke_lease_root
from tpuflow.storage import read_text
from tpuflow_rehearsal.dag_progress import airflow_log, following, say
from tpuflow_rehearsal.demo_env import demo_env, demo_storage
from tpuflow_rehearsal.ray_launcher import LocalRayLauncher
from tpuflow_rehearsal.standins.capacity import PROVISIONING_REQUESTS
from tpuflow_rehearsal.standins.kuberay_controller.seams import LaunchSpec, RayClusterHandle
from tpuflow_rehearsal.standins.kubernetes_api import PODS, RAYCLUSTERS, RAYSERVICES
from tpuflow_rehearsal.standins.stack import StandinStack

if TYPE_CHECKING:
    from tpuflow.local.cluster import LocalRayCluster

DAG_ID = "tpu_llm_pipeline_gke"
GCP_CONN_ID = "gke_standin"
KUBERNETES_CONN_ID = "kube_standin"
TEARDOWN_WAIT_S = 180.0
LEASE_SLOTS = 16  # slots looked at for leases, as `tpuflow leases list`
CHECKED = (
    "node pools, workload policies, RayClusters, RayServices, ProvisioningRequests, pods, Ray processes, slice leases"
)


def pipeline_variables(stack: Any, output_root: str) -> dict[str, str]:
    """AIRFLOW_VAR_* that point tpu_llm_pipeline_gke at the stand-ins (tpuflow.pipeline.gke.variable_settings)."""

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


def standin_leftovers(stack: StandinStack) -> list[str]:
    """What the teardowns delete, still in the stand-ins: node pools, workload policies, Kubernetes objects."""
    from tpuflow_rehearsal.rehearsal import RehearsalStack

    if isinstance(stack, RehearsalStack):
        return stack.leftovers()
    out = [f"node pool {p['name']}" for p in stack.gke.node_pools()]
    out += [f"workload policy {p['name']}" for p in stack.gke.compute.policies()]
    for rtype in (RAYSERVICES, RAYCLUSTERS, PROVISIONING_REQUESTS, PODS):
        out += [f"{rtype.kind} {o['metadata']['name']}" for o in stack.kube.store.list(rtype)]
    return out


def ray_process_leftovers(clusters: Sequence[LocalRayCluster]) -> list[str]:
    """Live processes of the Ray clusters the demo's launcher started: their nodes' process groups (by pid)
    and any process naming a cluster's temp dir (Ray processes that left the groups)."""
    from tpuflow.local.cluster import _group_alive, _pids_referencing

    out = []
    for cluster in clusters:
        pids = sorted({n.pid for n in cluster.nodes if _group_alive(n.pid)} | set(_pids_referencing(cluster.temp_dir)))
        if pids:
            out.append(f"Ray cluster {cluster.name} processes {pids}")
    return out


def held_leases(root: str | None = None) -> dict[int, str]:
    """Slot -> holder of the slice leases held now in ``root`` (default: the default lease root), as `tpuflow
    leases list` shows them."""
    from tpuflow.slices.leases import lease_store

    return {slot: lease.holder for slot, lease in lease_store(root).holders(LEASE_SLOTS).items()}


def lease_leftovers(before: Mapping[int, str], root: str | None = None) -> list[str]:
    """Slice leases held now in ``root`` that were not held before the run (``before``: held_leases(root) then)."""
    held = held_leases(root)
    return [f"slice lease slot {slot} ({holder})" for slot, holder in held.items() if before.get(slot) != holder]


def leftovers(
    stack: StandinStack,
    clusters: Sequence[LocalRayCluster],
    leases_before: Mapping[int, str],
    lease_root: str | None = None,
) -> list[str]:
    """Everything the run left behind (empty: nothing)."""
    return standin_leftovers(stack) + ray_process_leftovers(clusters) + lease_leftovers(leases_before, lease_root)


@dataclass
class Rehearsal:
    """The started stand-ins of one run, the storage environment they were given, the Ray clusters their launcher
    started (imitation) and the GKE pipeline's lease root for that output root."""

    stack: StandinStack
    storage_env: dict[str, str]
    started_clusters: list[LocalRayCluster]
    lease_root: str

    def wait_for_teardowns(self, leases_before: Mapping[int, str]) -> list[str]:
        """What is still left once the teardowns' deletions had TEARDOWN_WAIT_S to finish (the RayService's own
        RayCluster is collected after the RayService, a workload policy after its pool)."""
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while leftovers(self.stack, self.started_clusters, leases_before, self.lease_root):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return leftovers(self.stack, self.started_clusters, leases_before, self.lease_root)


@contextlib.contextmanager
def rehearsal(
    args: argparse.Namespace, work: Path, output_root: str, who: str = "tpuflow demo --backend gke"
) -> Iterator[Rehearsal]:
    """The stand-ins for one run (``args.control_plane``, ``args.operation_seconds``), and the GCS emulator of a
    gs:// output root, stopped on the way out (SIGTERM too, as Ctrl-C); ``who``: the command its lines name."""
    started_clusters: list[LocalRayCluster] = []

    class RecordingLauncher(LocalRayLauncher):
        def launch(self, spec: LaunchSpec) -> RayClusterHandle:
            handle = super().launch(spec)
            started_clusters.append(handle.cluster)  # type: ignore[attr-defined]
            return handle

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the stand-ins and their Ray clusters as Ctrl-C does

    signal.signal(signal.SIGTERM, interrupted)
    with demo_storage(output_root) as storage_env, _stack(args, work, storage_env, RecordingLauncher, who) as stack:
        print(f"  GKE API {stack.gke.url}, Kubernetes API {stack.kubernetes_url} (kubeconfig {stack.kubeconfig_path})")
        yield Rehearsal(stack, dict(storage_env), started_clusters, gke_lease_root(output_root))


def ray_processes_after_stop(run: Rehearsal, left: list[str]) -> list[str]:
    """``left`` plus the Ray processes still alive once the stand-ins stopped: none may outlive them."""
    return left + [item for item in ray_process_leftovers(run.started_clusters) if item not in left]


def _stack(
    args: argparse.Namespace, work: Path, storage_env: Mapping[str, str], launcher: Any, who: str
) -> StandinStack:
    """The imitation (StandinStack) or the real control plane (RehearsalStack), not started."""
    if getattr(args, "control_plane", "imitation") == "real":
        from tpuflow_rehearsal.rehearsal import RehearsalStack, unavailable

        why = unavailable()
        if why:
            raise UserInputError(
                "--control-plane", "real", f"{why}; or run on the imitation: --control-plane imitation"
            )

        print(f"{who}: starting the real control plane and the GKE stand-in in {work / 'rehearsal'}")
        return RehearsalStack(
            work / "rehearsal",
            operation_seconds=args.operation_seconds,
            pod_env={k: v for k, v in storage_env.items() if k == "STORAGE_EMULATOR_HOST"},
        )
    print(f"{who}: starting the GKE and Kubernetes stand-ins in {work / 'standins'}", flush=True)
    return StandinStack(
        work / "standins",
        operation_seconds=args.operation_seconds,
        launcher=launcher(work / "standins" / "ray-clusters", head_cpus=2, timeout=600),
    )


def run_gke(args: argparse.Namespace, conf: dict[str, Any]) -> int:
    """``conf``: the run's conf, already checked (tpuflow_rehearsal.demo.demo_conf)."""

    if args.keep_endpoint and not args.idle_timeout:
        raise UserInputError(
            "--keep-endpoint",
            True,
            "the GKE stand-ins stop with the demo: add --idle-timeout MINUTES (the demo serves until it is idle "
            "that long), or keep an endpoint with `tpuflow standins up` and your own DAG run",
        )
    work = Path(args.work_dir).resolve() / "gke"
    home = work / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    output_root = (args.output_root or str(work / "outputs")).rstrip("/")
    if "://" not in output_root and not output_root.startswith("gs:"):
        output_root = str(Path(output_root).resolve())
    started = time.time()
    with rehearsal(args, work, output_root) as run:
        stack = run.stack
        env = {
            **demo_env(home, output_root),
            **run.storage_env,
            **stack.airflow_connections(GCP_CONN_ID, KUBERNETES_CONN_ID),
            **pipeline_variables(stack, output_root),
        }
        airflow = str(Path(sys.executable).with_name("airflow"))
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        if not conf.get("serve_topology"):
            conf.pop("serve_topology", None)
        run_date = args.date or date.today().isoformat()
        leases_before = held_leases(run.lease_root)
        print(f"tpuflow demo: running {DAG_ID} for {run_date} with {json.dumps(conf)}", flush=True)
        log = None if args.verbose else airflow_log(home, run_date)
        code = _dags_test([airflow, "dags", "test", DAG_ID, run_date, "-c", json.dumps(conf)], env, log)
        elapsed = time.time() - started
        report = _report(output_root, run_date) if code == 0 else None
        left = run.wait_for_teardowns(leases_before)
    left = ray_processes_after_stop(run, left)
    total = time.time() - started
    if report is None:
        where = f"Airflow's whole log: {log}" if log else "the task logs above"
        print(f"\ntpuflow demo: the GKE pipeline FAILED after {elapsed:.0f}s ({where})", file=sys.stderr)
    else:
        print(
            f"\n=== tpuflow demo --backend gke: pipeline succeeded in {elapsed:.0f}s ({total:.0f}s with stand-ins) ==="
        )
        print(f"outputs:            {report['output_dir']}")
        print(f"held-out accuracy:  {report['accuracy']:.3f} on {report['heldout_examples']} problems")
        print(f"sample completion:  {report['sample_prompt']!r} -> {report['sample_completion']!r}")
        if "chip_hours" in report:
            print(f"{'chip hours:':<20}{json.dumps(report['chip_hours'])}")
        for line in ledger_lines(report.get("ledger")):
            print(line)
        pods = getattr(getattr(stack, "agent", None), "pods_started", None)
        if pods is not None:  # the real control plane: the node agent ran the pods the real KubeRay made
            heads = sum(1 for p in pods if "-head-" in p)
            print(
                f"pods run:           {len(pods)} by the node agent ({heads} Ray heads: CPU prep cluster, training slice, RayService)"
            )
        else:
            print(f"Ray clusters run:   {len(run.started_clusters)} (CPU prep cluster, training slice, RayService)")
    if left:
        print(f"tpuflow demo: FAILED: left behind after the run: {', '.join(left)}", file=sys.stderr)
        return 1
    print(f"left behind:        nothing ({CHECKED})")
    return 0 if report is not None else 1


def _dags_test(argv: list[str], env: Mapping[str, str], log: Path | None) -> int:
    """``airflow dags test``'s exit code; with ``log``, its output goes there and only the run's progress is printed
    (tpuflow_rehearsal.dag_progress, as the local demo does), with a failed task's last lines; without, it streams here."""
    if log is None:
        return subprocess.run(argv, env=env).returncode
    print(f"tpuflow demo --backend gke: Airflow's log: {log}", flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as output, following(log, say) as progress:
        code = subprocess.run(argv, env=env, stdout=output, stderr=subprocess.STDOUT).returncode
    for line in progress.failure_lines() if code else []:
        print(line, file=sys.stderr)
    return code


def _report(output_root: str, run_date: str) -> dict[str, Any] | None:

    text = read_text(f"{output_root}/{DAG_ID}/{run_date}/report.json")
    return json.loads(text) if text else None
