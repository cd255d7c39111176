"""The GKE rehearsal on the real control plane (issue 46): the GKE API stand-in (ours: node pools, operations,
Compute and Cloud Quotas calls) with real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the
real KubeRay operator (tpuflow_rehearsal.controlplane), GKE's nodes played by the node agent, GKE's TPU webhook
served to the real API server (tpuflow_rehearsal.nodes) and GKE's autoscaler for queued provisioning and flex-start
played against the real API server (tpuflow_rehearsal.played_autoscaler, with the ProvisioningRequest CRD).

    with RehearsalStack(workdir) as stack:
        stack.env()                       # KUBECONFIG, CLOUDSDK_* ... as StandinStack gives them
        stack.airflow_connections(...)    # the same AIRFLOW_CONN_* shapes

What is played and what is real is in the README ("GKE without a cloud"). The imitation (StandinStack: the
Python Kubernetes API and the simulated KubeRay operator) stays for the fast unit tier.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuflow.storage import emulator_env
from tpuflow_rehearsal.controlplane import binaries, pki
from tpuflow_rehearsal.controlplane.cluster import ControlPlane
from tpuflow_rehearsal.nodes import network as net
from tpuflow_rehearsal.nodes.agent import NodeAgent
from tpuflow_rehearsal.nodes.kube_rest import KubeError, KubeRest
from tpuflow_rehearsal.nodes.tpu_webhook import TpuWebhookServer
from tpuflow_rehearsal.played_autoscaler import AUTOSCALER_USER, install, start_autoscaler
from tpuflow_rehearsal.played_autoscaler import ROLES as AUTOSCALER_ROLES
from tpuflow_rehearsal.standins.capacity import CapacityController
from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
from tpuflow_rehearsal.standins.stack import (
    DEFAULT_CLUSTER,
    DEFAULT_PROJECT,
    DEFAULT_ZONE,
    GCP_CONN_ID,
    KUBERNETES_CONN_ID,
    StandinStack,
    serve,
    stack_arguments,
    stack_options,
)

NODE_AGENT_USER = "system:node:tpuflow-node-agent"


def unavailable() -> str | None:
    """Why the real control plane cannot run here (no root for the pod network, no binaries and no way to build
    them); None where it can. Builds the binaries when they are missing and can be built."""
    why = net.available()
    if why:
        return why
    try:
        binaries.ensure()
    except binaries.ControlPlaneUnavailable as err:
        return str(err)
    return None


def _loopback_port(url: str) -> int | None:
    parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
    return parsed.port if parsed.hostname in ("127.0.0.1", "localhost") else None


def host_ports(env: Mapping[str, str]) -> list[int]:
    """The loopback ports of host services ``env`` names (the node agent forwards them into the pod network)."""
    found = (_loopback_port(v) for v in env.values() if "127.0.0.1:" in v or "localhost:" in v)
    return sorted({p for p in found if p})


def pod_env_with_storage(pod_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``pod_env`` with the GCS emulator and its GCE metadata stand-in as every client library in a pod reads them
    (tpuflow.storage.emulator_env; this process's emulator unless ``pod_env`` names one). The node agent rewrites
    their loopback addresses to the pod network's gateway."""
    given = dict(pod_env or {})
    return {**emulator_env({**os.environ, **given}), **given}


class RehearsalStack(StandinStack):
    """GKE API stand-in + real control plane + node agent + TPU webhook (module docstring)."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        operation_seconds: float = 2.0,
        project: str = DEFAULT_PROJECT,
        zone: str = DEFAULT_ZONE,
        cluster: str = DEFAULT_CLUSTER,
        pod_env: dict[str, str] | None = None,
        interval: float = 0.5,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.project, self.zone, self.cluster = project, zone, cluster
        self.fake = False
        self.crds = None
        self.gke = GKEApiStandin(operation_seconds=operation_seconds, clusters=[self.cluster_path])
        self.index: int | None = None  # the pod network's, claimed by start() (a bridge: nothing before that)
        self.plane = ControlPlane(
            self.workdir / "controlplane",
            extra_users={
                NODE_AGENT_USER: ("system:node", "system:node-proxier", "tpuflow:cloud-node-lifecycle"),
                AUTOSCALER_USER: AUTOSCALER_ROLES,
            },
        )
        self.pod_env = pod_env_with_storage(pod_env)
        self.interval = interval
        self.webhook: TpuWebhookServer | None = None
        self.agent: NodeAgent | None = None
        self.autoscaler: CapacityController | None = None

    # --- the Kubernetes side ------------------------------------------------------------------------------
    @property
    def kubeconfig_path(self) -> Path:
        return self.plane.kubeconfig("admin")

    @property
    def kubernetes_url(self) -> str:
        return self.plane.url

    def kubernetes_connection_env(self, conn_id: str) -> dict[str, str]:
        value = {
            "conn_type": "kubernetes",
            "extra": {"kube_config_path": str(self.kubeconfig_path), "namespace": "default"},
        }
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(value)}

    def api(self, user: str = "admin") -> KubeRest:
        return KubeRest(self.plane.url, self.plane.token(user), str(self.plane.paths["ca_cert"]))

    # --- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> RehearsalStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.index = net.claim_index()
            self.plane.service_cidr = net.service_cidr(self.index)  # Services answer in this network's range
            self.gke.start()
            self.plane.start()
            self._start_webhook()
            install(self.api())
            self.autoscaler = start_autoscaler(
                self.api(AUTOSCALER_USER), self.gke, self.cluster_path, interval=self.interval
            )
            self.start_node_agent()
        except BaseException:
            self.stop()
            raise
        self.write_files()
        return self

    def start_node_agent(self) -> NodeAgent:
        """GKE's nodes: at start, and again after ``kill_node_agent`` (the nodes coming back)."""
        self.agent = NodeAgent(
            self.api(NODE_AGENT_USER),
            self.workdir / "nodes",
            cluster=self.cluster_path,
            pools=lambda: self.gke.node_pools(self.cluster_path),
            index=self.index,
            host_ports=host_ports(self.pod_env),
            extra_env=self.pod_env,
            interval=self.interval,
        ).start()
        return self.agent

    def kill_node_agent(self) -> None:
        """Every node dies at once, with its pods' processes (``NodeAgent.crash``); ``start_node_agent`` brings
        them back."""
        if self.agent is not None:
            self.agent.crash()

    def _start_webhook(self) -> None:
        ca = pki.load_ca(self.plane.workdir / "pki")
        cert, key = ca.serving_pair("kuberay-tpu-webhook", ["127.0.0.1"])
        admin = self.api()

        def pods(namespace: str, cluster: str, group: str) -> list[dict[str, Any]]:
            selector = f"ray.io/cluster={cluster},ray.io/group={group}"
            return admin.items(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)

        self.webhook = TpuWebhookServer(cert, key, pods).start()
        mutating, validating = self.webhook.configurations(ca.cert_pem)
        for path, body in (
            ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", mutating),
            ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", validating),
        ):
            try:
                admin.request("POST", path, body)
            except KubeError as err:
                if err.status != 409:
                    raise

    def stop(self) -> None:
        if self.autoscaler is not None:
            self.autoscaler.stop()
        try:
            if self.agent is not None:
                self.agent.stop()
            elif self.index is not None:
                net.PodNetwork(self.index).down()
        finally:
            try:
                if self.webhook is not None:
                    self.webhook.stop()
                self.plane.stop()
            finally:
                self.gke.stop()

    def leftovers(self) -> list[str]:
        """What a run's teardowns delete, still here: node pools, workload policies, KubeRay objects,
        ProvisioningRequests and their PodTemplates, pods and their processes (a pod's network namespace holds
        them)."""
        out = [f"node pool {p['name']}" for p in self.gke.node_pools()]
        out += [f"workload policy {p['name']}" for p in self.gke.compute.policies()]
        api = self.api()
        for kind, path in (
            ("RayService", "/apis/ray.io/v1/rayservices"),
            ("RayCluster", "/apis/ray.io/v1/rayclusters"),
            ("ProvisioningRequest", "/apis/autoscaling.x-k8s.io/v1/provisioningrequests"),
            ("PodTemplate", "/api/v1/podtemplates"),
            ("Pod", "/api/v1/pods"),
        ):
            out += [f"{kind} {o['metadata']['name']}" for o in api.items(path)]
        if self.agent is not None:
            out += [f"pod network namespace {n}" for n in self.agent.network.namespaces()]
        return out

    def state(self) -> dict[str, Any]:
        return {**super().state(), "control_plane": "real", "components": self.plane.state()}


def main(argv: list[str] | None = None) -> int:
    """Serve the rehearsal until SIGTERM / SIGINT (what ``tpuflow standins up --control-plane real`` runs)."""
    args = stack_arguments("python -m tpuflow_rehearsal.rehearsal", main.__doc__).parse_args(argv)
    return serve(RehearsalStack(args.workdir, **stack_options(args)))


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["GCP_CONN_ID", "KUBERNETES_CONN_ID", "RehearsalStack", "main"]
