"""The bridge from the simulated KubeRay controller to real Ray: LocalRayLauncher starts LocalRayCluster.

The stand-ins (tpuflow_rehearsal.standins) describe a worker group's slice in their own terms (SliceShape:
the GKE accelerator label, topology, google.com/tpu per pod, hosts, replicas). Starting real Ray
processes for it is tpuflow.local's job, which takes a tpuflow TpuSlice: this module translates one
into the other and wraps the running cluster as the controller's RayClusterHandle. It is the only
place where the simulated cluster meets project code, and it judges nothing (the webhook, the
scheduling and the KubeRay status stay in the stand-in).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuflow.tpu import TpuSlice
    from tpuflow_rehearsal.standins.gke_tpu import SliceShape
    from tpuflow_rehearsal.standins.kuberay_controller.seams import LaunchSpec, RayClusterHandle


def tpu_slice(shape: SliceShape | None) -> TpuSlice | None:
    """The TpuSlice LocalRayCluster simulates for a worker group's slice (None: a CPU-only cluster)."""
    if shape is None:
        return None
    from tpuflow.tpu import TpuSlice

    return TpuSlice.from_spec(shape.accelerator, shape.topology, shape.machine_type, shape.slices)


class LocalRayLauncher:
    """Launches the embedded LocalRayCluster: a head plus one simulated TPU host per worker pod.

    The Ray processes get the RayCluster's authentication as KubeRay's containers do: RAY_AUTH_MODE and
    RAY_AUTH_TOKEN from the head container's env (the stand-in resolves the token from the cluster's
    Secret), so a token-mode cluster refuses dashboard, Jobs and Serve REST calls without that token.
    ``auth_mode`` applies to a cluster whose manifest sets no RAY_AUTH_MODE ("disabled" mirrors a KubeRay
    cluster without authOptions: no token needed).
    """

    def __init__(
        self,
        base_dir: str | Path,
        *,
        head_cpus: int = 2,
        host_cpus: int | None = None,
        env: Mapping[str, str] | None = None,
        auth_mode: str = "disabled",
        timeout: float = 180.0,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.head_cpus, self.host_cpus, self.timeout = head_cpus, host_cpus, timeout
        self.env = dict(env or {})
        self.auth_mode = auth_mode

    def launch(self, spec: LaunchSpec) -> RayClusterHandle:
        from tpuflow.local.cluster import LocalRayCluster

        env = {**spec.env, **self.env}
        env.setdefault("RAY_AUTH_MODE", self.auth_mode)
        # The token goes to the cluster's 0600 token file (RAY_AUTH_TOKEN_PATH), not into process environments.
        token = env.pop("RAY_AUTH_TOKEN", None) if env["RAY_AUTH_MODE"] == "token" else None
        cluster = LocalRayCluster.start(
            tpu_slice(spec.tpu),
            spec.key,
            self.base_dir,
            head_cpus=self.head_cpus,
            host_cpus=self.host_cpus,
            env=env,
            timeout=self.timeout,
            adopt=False,
            auth_token=token,
        )
        return LocalRayHandle(cluster)


class LocalRayHandle:
    """RayClusterHandle over a LocalRayCluster: Serve through the dashboard REST API, logs from node files."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.dashboard_url: str = cluster.dashboard_url
        self.gcs_address: str = cluster.gcs_address
        self.serve_port: int = cluster.serve_port
        self.metrics_port: int = cluster.metrics_port

    def stop(self) -> None:
        self.cluster.stop()

    def deploy_serve(self, config: dict[str, Any]) -> None:
        import requests

        body = dict(config)
        body["http_options"] = {**(config.get("http_options") or {}), "host": "127.0.0.1", "port": self.serve_port}
        resp = requests.put(
            f"{self.dashboard_url}/api/serve/applications/", json=body, headers=self.cluster.auth_headers(), timeout=60
        )
        if resp.status_code >= 400:
            raise RuntimeError(f"PUT /api/serve/applications/ -> {resp.status_code}: {resp.text[:500]}")

    def serve_status(self) -> dict[str, Any]:
        import requests

        resp = requests.get(
            f"{self.dashboard_url}/api/serve/applications/", headers=self.cluster.auth_headers(), timeout=10
        )
        resp.raise_for_status()
        return dict(resp.json())

    def log_tail(self, role: str, lines: int) -> list[str]:
        for node in self.cluster.nodes:
            label = "head" if node.role == "head" else f"{node.slice_name}-w{node.worker_id}"
            if role in (label, node.role) or (role != "head" and label.endswith(role)):
                try:
                    return Path(node.log).read_text(errors="replace").splitlines()[-lines:]
                except OSError:
                    return []
        return []
