"""The GKE and Kubernetes stand-ins (and the simulated KubeRay operator) started together, as one fake GKE cluster.

``StandinStack`` starts the GKE API stand-in (node pools, operations) and the Kubernetes API stand-in
(HTTPS, kubectl-ready) with the simulated KubeRay operator, whose TPU worker pods are scheduled on the
GKE stand-in's node pools of the one cluster it plays. It writes, in its work directory:

- ``kubeconfig``: the Kubernetes stand-in's address, CA and token;
- ``env.sh``: KUBECONFIG, the CLOUDSDK_* variables gcloud needs (container and compute endpoint overrides, access token,
  project, zone, a private CLOUDSDK_CONFIG so the user's gcloud configuration is left alone) and the
  seeds' PROJECT_ID / CLUSTER_NAME / ZONE / REGION, so the seeds' commands run as written;
- ``state.json``: addresses, token, the serving process's pid (``tpuflow standins down`` reads it) and the
  AIRFLOW_CONN_* values of a GCP and a Kubernetes connection to the stand-ins (``tpuflow standins env``).

Used in-process by ``tpuflow demo --backend gke`` and from the command line by ``tpuflow standins up``
(which runs ``python -m tpuflow_rehearsal.standins.stack --workdir DIR`` in its own session until SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tpuflow.errors import UserInputError
from tpuflow_rehearsal.standins import kuberay_crds
from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, GkeNodePools, KubeRayStandin
from tpuflow_rehearsal.standins.kuberay_controller.seams import ClusterLauncher
from tpuflow_rehearsal.standins.kubernetes_catalog import holds_crds

DEFAULT_PROJECT = "tpu-proj-123"
DEFAULT_ZONE = "us-east5-b"
DEFAULT_CLUSTER = "tpu-cluster"
STATE_FILE = "state.json"
ENV_FILE = "env.sh"
ACCESS_TOKEN = "tpuflow-standin-token"  # gcloud needs one; the GKE stand-in accepts any
GCP_CONN_ID = "gke_standin"  # the Airflow connections state.json describes (`tpuflow standins env` prints them)
KUBERNETES_CONN_ID = "kube_standin"
CRDS_ENV = "TPUFLOW_KUBERAY_CRDS"


def default_crds() -> Path:
    """KubeRay's CRDs for schemas and field validation: $TPUFLOW_KUBERAY_CRDS, else the ones tpuflow ships."""
    named = os.environ.get(CRDS_ENV)
    if not named:
        return kuberay_crds.DIRECTORY
    if not holds_crds(named):
        raise UserInputError(
            CRDS_ENV, named, "name the directory holding KubeRay's ray.io_rayclusters.yaml, or unset it"
        )
    return Path(named)


class StandinStack:
    """GKE + Kubernetes stand-ins + simulated KubeRay: ``with StandinStack(DIR) as stack: stack.env()``."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        fake: bool = False,
        operation_seconds: float = 2.0,
        project: str = DEFAULT_PROJECT,
        zone: str = DEFAULT_ZONE,
        cluster: str = DEFAULT_CLUSTER,
        crds: str | Path | None = None,
        launcher: ClusterLauncher | None = None,
        interval: float = 0.2,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.project, self.zone, self.cluster = project, zone, cluster
        self.fake = fake
        self.crds: Path | None = Path(crds) if crds else default_crds()
        self.gke = GKEApiStandin(operation_seconds=operation_seconds, clusters=[self.cluster_path])
        if launcher is None and fake:
            launcher = FakeRayLauncher()
        self.kube = KubeRayStandin(
            self.workdir,
            launcher=launcher,
            node_pools=GkeNodePools(self.gke, cluster=self.cluster_path),
            interval=interval,
            crds=self.crds,
        )

    @property
    def cluster_path(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/clusters/{self.cluster}"

    # --- the Kubernetes side (RehearsalStack, tpuflow_rehearsal.rehearsal, puts the real control plane here) ---
    @property
    def kubeconfig_path(self) -> Path:
        return self.kube.kubeconfig_path

    @property
    def kubernetes_url(self) -> str:
        return self.kube.api.url

    def kubernetes_connection_env(self, conn_id: str) -> dict[str, str]:
        return self.kube.connection_env(conn_id)

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0] if self.zone.count("-") == 2 else self.zone

    def start(self) -> StandinStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.gke.start()
        try:
            self.kube.start()
        except BaseException:
            self.gke.stop()
            raise
        self.write_files()
        return self

    def stop(self) -> None:
        try:
            self.kube.stop()
        finally:
            self.gke.stop()

    def __enter__(self) -> StandinStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what clients need ---
    def env(self) -> dict[str, str]:
        """The shell environment that points kubectl and gcloud (and the seeds' variables) at the stand-ins."""
        return {
            "KUBECONFIG": str(self.kubeconfig_path),
            "KUBECACHEDIR": str(self.workdir / "kube-cache"),
            "CLOUDSDK_CONFIG": str(self.workdir / "gcloud"),
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER": f"{self.gke.url}/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{self.gke.url}/compute/v1/",
            "CLOUDSDK_AUTH_ACCESS_TOKEN": ACCESS_TOKEN,
            "CLOUDSDK_CORE_PROJECT": self.project,
            "CLOUDSDK_COMPUTE_ZONE": self.zone,
            "CLOUDSDK_COMPUTE_REGION": self.region,
            "CLOUDSDK_CONTAINER_CLUSTER": self.cluster,
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
            "PROJECT_ID": self.project,
            "CLUSTER_NAME": self.cluster,
            "ZONE": self.zone,
            "REGION": self.region,
            "TPUFLOW_STANDIN_GKE_URL": self.gke.url,
            "TPUFLOW_STANDIN_KUBERNETES_URL": self.kubernetes_url,
        }

    def airflow_connections(self, gcp_conn_id: str, kubernetes_conn_id: str) -> dict[str, str]:
        """AIRFLOW_CONN_* for a google_cloud_platform connection to the GKE stand-in and a kubernetes one."""
        return {
            f"AIRFLOW_CONN_{gcp_conn_id.upper()}": json.dumps(self.gke.airflow_connection(self.project)),
            **self.kubernetes_connection_env(kubernetes_conn_id),
        }

    def state(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "gke_url": self.gke.url,
            "kubernetes_url": self.kubernetes_url,
            "kubeconfig": str(self.kubeconfig_path),
            "env_file": str(self.workdir / ENV_FILE),
            "project": self.project,
            "zone": self.zone,
            "cluster": self.cluster,
            "fake": self.fake,
            "crds": str(self.crds) if self.crds else None,  # None: the real control plane installs its own
            "gcp_conn_id": GCP_CONN_ID,
            "kubernetes_conn_id": KUBERNETES_CONN_ID,
            "airflow_connections": self.airflow_connections(GCP_CONN_ID, KUBERNETES_CONN_ID),
        }

    def write_files(self) -> None:
        lines = [f"# tpuflow stand-ins in {self.workdir}: source this file (stop: tpuflow standins down)"]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in self.env().items()]
        (self.workdir / ENV_FILE).write_text("\n".join(lines) + "\n")
        (self.workdir / "gcloud").mkdir(exist_ok=True)
        tmp = self.workdir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.state(), indent=2))
        tmp.replace(self.workdir / STATE_FILE)  # readers never see half a file


def stack_arguments(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The command line both stacks take (this one adds --fake and --crds)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--operation-seconds", type=float, default=2.0)
    parser.add_argument("--project", default=DEFAULT_PROJECT)
    parser.add_argument("--zone", default=DEFAULT_ZONE)
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER)
    return parser


def stack_options(args: argparse.Namespace) -> dict[str, Any]:
    """What stack_arguments parsed, past --workdir, as either stack's keyword arguments."""
    return {
        "operation_seconds": args.operation_seconds,
        "project": args.project,
        "zone": args.zone,
        "cluster": args.cluster,
    }


def serve(stack: StandinStack) -> int:
    """Run ``stack`` until SIGTERM / SIGINT, its state printed once it is up; the state file goes with it."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with stack:
        print(json.dumps(stack.state()), flush=True)
        stop.wait()
    (stack.workdir / STATE_FILE).unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Serve the stack until SIGTERM / SIGINT (what ``tpuflow standins up`` runs in the background)."""
    parser = stack_arguments("python -m tpuflow_rehearsal.standins.stack", main.__doc__)
    parser.add_argument("--fake", action="store_true", help="no Ray processes behind the simulated KubeRay")
    parser.add_argument("--crds", default=None)
    args = parser.parse_args(argv)
    return serve(StandinStack(args.workdir, fake=args.fake, crds=args.crds, **stack_options(args)))


if __name__ == "__main__":
    sys.exit(main())
