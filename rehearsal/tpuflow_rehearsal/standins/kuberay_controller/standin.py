"""The Kubernetes API stand-in plus the simulated KubeRay operator in one object, and a command line."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from tpuflow_rehearsal.ray_launcher import LocalRayLauncher
from tpuflow_rehearsal.standins.capacity import CapacityController
from tpuflow_rehearsal.standins.capacity_objects import StoreObjects
from tpuflow_rehearsal.standins.kuberay_controller.launchers import FakeRayLauncher
from tpuflow_rehearsal.standins.kuberay_controller.reconciler import KubeRayController
from tpuflow_rehearsal.standins.kuberay_controller.seams import (
    ClusterLauncher,
    GkeNodePools,
    NodePoolDirectory,
    StaticNodePools,
)
from tpuflow_rehearsal.standins.kubernetes_api import KubernetesApiStandin, ObjectStore


class KubeRayStandin:
    """The Kubernetes API stand-in plus the simulated KubeRay operator, ready for an Airflow connection.

        with KubeRayStandin(tmp_path, node_pools=GkeNodePools(gke_standin)) as kube:
            os.environ.update(kube.connection_env("kube_standin"))
            ...  # KubeRay operators with kubernetes_conn_id="kube_standin"

    launcher defaults to tpuflow_rehearsal.ray_launcher.LocalRayLauncher (real Ray); tests without Ray pass
    FakeRayLauncher(). crds: KubeRay's CRD directory (OpenAPI schemas, field validation; see kubernetes_api).
    """

    def __init__(
        self,
        workdir: str | Path,
        *,
        launcher: ClusterLauncher | None = None,
        node_pools: NodePoolDirectory | None = None,
        interval: float = 0.2,
        namespace: str = "default",
        crds: str | Path | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.namespace = namespace
        self.api = KubernetesApiStandin(crds=crds)
        if launcher is None:
            launcher = LocalRayLauncher(self.workdir / "ray-clusters")
        self.launcher = launcher
        self.controller = KubeRayController(self.api.store, self.launcher, node_pools, interval=interval)
        # GKE's autoscaler for queued (ProvisioningRequest) and flex-start pools, when the pools are GKE's
        self.capacity = (
            CapacityController(StoreObjects(self.api.store), node_pools, interval=interval)
            if isinstance(node_pools, GkeNodePools)
            else None
        )
        self.kubeconfig_path = self.workdir / "kubeconfig"

    @property
    def store(self) -> ObjectStore:
        return self.api.store

    def start(self) -> KubeRayStandin:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.api.start()
        self.api.write_kubeconfig(self.kubeconfig_path, self.namespace)
        self.controller.start()
        if self.capacity is not None:
            self.capacity.start()
        return self

    def stop(self) -> None:
        if self.capacity is not None:
            self.capacity.stop()
        self.controller.stop()
        self.api.stop()

    def __enter__(self) -> KubeRayStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def connection_env(self, conn_id: str = "kubernetes_default") -> dict[str, str]:
        """AIRFLOW_CONN_<ID> for a kubernetes connection whose kube_config_path points here."""
        return self.api.airflow_connection_env(conn_id, self.kubeconfig_path, self.namespace)


def main(argv: list[str] | None = None) -> int:
    """``python -m tpuflow_rehearsal.standins.kuberay_controller --workdir DIR [--gke-url URL] [--fake]``: serve
    until SIGTERM, after printing the kubeconfig path and the AIRFLOW_CONN_<ID> line to export."""

    parser = argparse.ArgumentParser(
        prog="python -m tpuflow_rehearsal.standins.kuberay_controller", description=main.__doc__
    )
    parser.add_argument("--workdir", required=True, help="kubeconfig and local Ray clusters go here")
    parser.add_argument("--gke-url", default=None, help="GKE stand-in base URL (node pools gate TPU workers)")
    parser.add_argument("--gke-cluster", default=None, help="projects/P/locations/L/clusters/C to count pools of")
    parser.add_argument("--conn-id", default="kubernetes_default")
    parser.add_argument("--fake", action="store_true", help="no Ray processes (scripted Serve statuses)")
    args = parser.parse_args(argv)
    pools: NodePoolDirectory = (
        GkeNodePools(args.gke_url, cluster=args.gke_cluster) if args.gke_url else StaticNodePools([], cpu_nodes=1)
    )
    launcher = FakeRayLauncher() if args.fake else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with KubeRayStandin(args.workdir, launcher=launcher, node_pools=pools) as kube:
        print(f"kubernetes API: {kube.api.url}\nkubeconfig: {kube.kubeconfig_path}", flush=True)
        for key, value in kube.connection_env(args.conn_id).items():
            print(f"export {key}='{value}'", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    return 0
