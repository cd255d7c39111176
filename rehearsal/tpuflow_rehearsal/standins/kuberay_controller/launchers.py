"""The fake cluster launcher, for tests without Ray (the real one is tpuflow_rehearsal.ray_launcher.LocalRayLauncher)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuflow_rehearsal.standins.kuberay_controller.seams import LaunchSpec, RayClusterHandle


@dataclass
class FakeServeBehaviour:
    """How the fake cluster's Serve reports every application after `delay` seconds."""

    app_status: str = "RUNNING"  # RUNNING | DEPLOYING | DEPLOY_FAILED | UNHEALTHY | NOT_STARTED
    message: str = ""
    deployment_message: str = ""
    delay: float = 0.0


_DEPLOYMENT_STATUS = {
    "RUNNING": "HEALTHY",
    "DEPLOYING": "UPDATING",
    "DEPLOY_FAILED": "DEPLOY_FAILED",
    "UNHEALTHY": "UNHEALTHY",
}


class FakeRayHandle:
    """No Ray processes: addresses on unused loopback ports and scripted Serve statuses."""

    def __init__(self, spec: LaunchSpec, serve: Mapping[str, FakeServeBehaviour], ports: tuple[int, int, int]) -> None:
        self.spec, self.serve = spec, serve
        self.dashboard_url = f"http://127.0.0.1:{ports[0]}"
        self.gcs_address = f"127.0.0.1:{ports[1]}"
        self.serve_port = ports[2]
        self.metrics_port = 0  # no Ray, no metrics
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
                "deployments": {
                    d: {"status": dep_status, "message": script.deployment_message if final else ""} for d in deps
                },
            }
        return {"applications": apps, "proxies": {"head": {"status": "HEALTHY"}}}

    def log_tail(self, role: str, lines: int) -> list[str]:
        text = [f"[fake {role}] ray start --head (simulated, no Ray processes)", "[fake] Ray runtime started."]
        return text[-lines:]


class FakeRayLauncher:
    """A ClusterLauncher for tests that need KubeRay semantics but no Ray (fast, no processes)."""

    def __init__(
        self,
        *,
        launch_delay: float = 0.0,
        serve: FakeServeBehaviour | Mapping[str, FakeServeBehaviour] | None = None,
        fail_with: str | None = None,
    ) -> None:
        """serve: one behaviour for every application, or {application name | "*": behaviour}."""
        self.launch_delay, self.fail_with = launch_delay, fail_with
        self.serve: dict[str, FakeServeBehaviour] = (
            {"*": serve} if isinstance(serve, FakeServeBehaviour) else dict(serve or {"*": FakeServeBehaviour()})
        )
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
