"""Cluster launchers: the embedded LocalRayCluster (real Ray) and a fake for tests without Ray."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuflow.dev.standins.kuberay_controller.seams import LaunchSpec, RayClusterHandle


class LocalRayLauncher:
    """Launches the embedded LocalRayCluster: a head plus one simulated TPU host per worker pod.

    auth_mode "disabled" mirrors a KubeRay cluster without authOptions (dashboard and Serve REST without
    a token), so downstream tasks use the addresses from XCom as they would on GKE.
    """

    def __init__(self, base_dir: str | Path, *, head_cpus: int = 2, host_cpus: int = 1,
                 env: Mapping[str, str] | None = None, auth_mode: str = "disabled", timeout: float = 180.0) -> None:
        self.base_dir = Path(base_dir)
        self.head_cpus, self.host_cpus, self.timeout = head_cpus, host_cpus, timeout
        self.env = dict(env or {})
        self.auth_mode = auth_mode

    def launch(self, spec: LaunchSpec) -> RayClusterHandle:
        from tpuflow.local.cluster import LocalRayCluster

        env = {**spec.env, **self.env, "RAY_AUTH_MODE": self.auth_mode}
        cluster = LocalRayCluster.start(spec.tpu, spec.key, self.base_dir, head_cpus=self.head_cpus,
                                        host_cpus=self.host_cpus, env=env, timeout=self.timeout, adopt=False)
        return LocalRayHandle(cluster)


class LocalRayHandle:
    """RayClusterHandle over a LocalRayCluster: Serve through the dashboard REST API, logs from node files."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.dashboard_url: str = cluster.dashboard_url
        self.gcs_address: str = cluster.gcs_address
        self.serve_port: int = cluster.serve_port

    def stop(self) -> None:
        self.cluster.stop()

    def deploy_serve(self, config: dict[str, Any]) -> None:
        import requests

        body = dict(config)
        body["http_options"] = {**(config.get("http_options") or {}), "host": "127.0.0.1", "port": self.serve_port}
        resp = requests.put(f"{self.dashboard_url}/api/serve/applications/", json=body,
                            headers=self.cluster.auth_headers(), timeout=60)
        if resp.status_code >= 400:
            raise RuntimeError(f"PUT /api/serve/applications/ -> {resp.status_code}: {resp.text[:500]}")

    def serve_status(self) -> dict[str, Any]:
        import requests

        resp = requests.get(f"{self.dashboard_url}/api/serve/applications/", headers=self.cluster.auth_headers(),
                            timeout=10)
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


@dataclass
class FakeServeBehaviour:
    """How the fake cluster's Serve reports every application after `delay` seconds."""

    app_status: str = "RUNNING"  # RUNNING | DEPLOYING | DEPLOY_FAILED | UNHEALTHY | NOT_STARTED
    message: str = ""
    deployment_message: str = ""
    delay: float = 0.0


_DEPLOYMENT_STATUS = {"RUNNING": "HEALTHY", "DEPLOYING": "UPDATING", "DEPLOY_FAILED": "DEPLOY_FAILED",
                      "UNHEALTHY": "UNHEALTHY"}


class FakeRayHandle:
    """No Ray processes: addresses on unused loopback ports and scripted Serve statuses."""

    def __init__(self, spec: LaunchSpec, serve: Mapping[str, FakeServeBehaviour], ports: tuple[int, int, int]) -> None:
        self.spec, self.serve = spec, serve
        self.dashboard_url = f"http://127.0.0.1:{ports[0]}"
        self.gcs_address = f"127.0.0.1:{ports[1]}"
        self.serve_port = ports[2]
        self.deployed: list[dict[str, Any]] = []
        self._deployed_at = 0.0
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def deploy_serve(self, config: dict[str, Any]) -> None:
        self.deployed.append(config)
        self._deployed_at = time.monotonic()

    def serve_status(self) -> dict[str, Any]:
        if not self.deployed:
            return {"applications": {}, "proxies": {}}
        elapsed = time.monotonic() - self._deployed_at
        apps = {}
        for app in self.deployed[-1].get("applications") or []:
            name = app.get("name", "default")
            script = self.serve.get(name) or self.serve.get("*") or FakeServeBehaviour()
            status = script.app_status if elapsed >= script.delay else "DEPLOYING"
            final = status == script.app_status
            deps = [d.get("name") for d in app.get("deployments") or [] if d.get("name")] or ["default"]
            dep_status = _DEPLOYMENT_STATUS.get(status, "UPDATING")
            apps[name] = {
                "status": status,
                "message": script.message if final else "",
                "deployments": {d: {"status": dep_status, "message": script.deployment_message if final else ""}
                                for d in deps},
            }
        return {"applications": apps, "proxies": {"head": {"status": "HEALTHY"}}}

    def log_tail(self, role: str, lines: int) -> list[str]:
        text = [f"[fake {role}] ray start --head (simulated, no Ray processes)", "[fake] Ray runtime started."]
        return text[-lines:]


class FakeRayLauncher:
    """A ClusterLauncher for tests that need KubeRay semantics but no Ray (fast, no processes)."""

    def __init__(self, *, launch_delay: float = 0.0,
                 serve: FakeServeBehaviour | Mapping[str, FakeServeBehaviour] | None = None,
                 fail_with: str | None = None) -> None:
        """serve: one behaviour for every application, or {application name | "*": behaviour}."""
        self.launch_delay, self.fail_with = launch_delay, fail_with
        self.serve: dict[str, FakeServeBehaviour] = (
            {"*": serve} if isinstance(serve, FakeServeBehaviour) else dict(serve or {"*": FakeServeBehaviour()}))
        self.launched: list[FakeRayHandle] = []
        self._next_port = 40000

    def launch(self, spec: LaunchSpec) -> RayClusterHandle:
        time.sleep(self.launch_delay)
        if self.fail_with:
            raise RuntimeError(self.fail_with)
        ports = (self._next_port, self._next_port + 1, self._next_port + 2)
        self._next_port += 3
        handle = FakeRayHandle(spec, self.serve, ports)
        self.launched.append(handle)
        return handle
