"""Deploy Ray Serve applications through the dashboard REST API and smoke-test the endpoint."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from tpuflow.errors import UserInputError
from tpuflow.links import StoredUrlLink
from tpuflow.rayjob.links import RayDashboardLink

if TYPE_CHECKING:
    from airflow.sdk import Context


class RayServeEndpointLink(StoredUrlLink):
    name = "Serve Endpoint"
    key = "ray_serve_endpoint"


class RayServeDeploymentFailedError(RuntimeError):
    """Serve reported DEPLOY_FAILED/UNHEALTHY, or the applications stayed unready past the deadline."""


class RayServeDeployOperator(BaseOperator):
    """PUT a Serve config (what KubeRay's RayService controller does) and wait until every app is RUNNING.

    :param serve_config: body for PUT /api/serve/applications/ (see tpuflow.serve.config); templated.
    :param cluster: the cluster-start task's XCom (dashboard_url, serve_url, ...).
    :param serve_slice: optional {"accelerator", "topology", ...} the model is served on; a multi-host
        slice without a declared topology is rejected before anything is deployed.
    :param deploy_timeout: seconds to wait for RUNNING before failing with what is stuck and why.
    """

    template_fields: Sequence[str] = ("serve_config", "cluster", "serve_slice")
    template_fields_renderers = {"serve_config": "json", "cluster": "json"}
    operator_extra_links = (RayServeEndpointLink(), RayDashboardLink())
    ui_color = "#ffe7c2"

    def __init__(
        self,
        *,
        serve_config: dict[str, Any],
        cluster: dict[str, Any] | None = None,
        ray_conn_id: str | None = None,
        serve_slice: dict[str, Any] | None = None,
        deploy_timeout: float = 600.0,
        poll_interval: float = 2.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.serve_config = serve_config
        self.cluster = cluster
        self.ray_conn_id = ray_conn_id
        self.serve_slice = serve_slice
        self.deploy_timeout = deploy_timeout
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    def execute(self, context: Context) -> Any:
        from tpuflow.rayjob.hooks import RayJobHook
        from tpuflow.serve.config import application_names, check_tpu_placement
        from tpuflow.tpu import TpuSlice

        if not isinstance(self.serve_config, dict):
            raise UserInputError("serve_config", self.serve_config, "give the Serve config as a dict")
        tpu = None
        if self.serve_slice:
            s = self.serve_slice
            tpu = TpuSlice.from_spec(s["accelerator"], s["topology"], s.get("machine_type"), s.get("num_slices", 1))
        check_tpu_placement(self.serve_config, tpu)
        hook = RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster if isinstance(self.cluster, dict) else None)
        RayDashboardLink.persist(context, url=f"{hook.dashboard_url}/#/serve")
        RayServeEndpointLink.persist(context, url=hook.serve_url)
        names = application_names(self.serve_config)
        created = self._absent_apps(hook, names)  # what killing this task deletes (see on_kill)
        self.log.info("Deploying Serve applications %s to %s", names, hook.dashboard_url)
        hook.put_serve_config(self.serve_config)
        if self.deferrable:
            from tpuflow.serve.triggers import RayServeApplicationsTrigger

            self.defer(
                trigger=RayServeApplicationsTrigger(
                    app_names=names,
                    cluster=hook.cluster,
                    ray_conn_id=self.ray_conn_id,
                    timeout=self.deploy_timeout,
                    poll_interval=self.poll_interval,
                    delete_on_kill=created,
                ),
                method_name="execute_complete",
            )
        self._kill_with = (hook, created)
        try:
            event = self._wait_blocking(hook, names)
        finally:
            self._kill_with = None
        return self.execute_complete(context, event)

    def _absent_apps(self, hook: Any, names: list[str]) -> list[str]:
        """The apps this deploy creates (not on the cluster before its PUT); [] when that is unknown."""
        try:
            present = (hook.get_serve_applications() or {}).get("applications") or {}
        except Exception as err:  # Serve not answering yet; without knowing, a kill deletes nothing
            self.log.info("Could not list Serve applications before deploying (%s)", err)
            return []
        return [n for n in names if n not in present]

    def on_kill(self) -> None:
        """Killed while waiting in the worker (not deferred): delete the apps this task created.

        Same rule as RayServeApplicationsTrigger.on_kill: only when every app on the cluster is one of them.
        """
        kill_with = getattr(self, "_kill_with", None)
        if not kill_with or not kill_with[1]:
            return
        from tpuflow.serve.status import deletable_on_kill

        hook, created = kill_with
        if deletable_on_kill(hook.get_serve_applications(), created):
            self.log.warning("Task killed: deleting Serve applications %s", created)
            hook.delete_serve_applications()

    def _wait_blocking(self, hook: Any, names: list[str]) -> dict[str, Any]:
        from tpuflow.serve.status import STUCK_HINT, judge

        deadline = time.time() + self.deploy_timeout
        detail = ""
        while time.time() < deadline:
            verdict = judge(hook.get_serve_applications(), names)
            detail = verdict.detail
            if verdict.state in ("running", "failed"):
                return {"status": verdict.state, "detail": detail}
            time.sleep(self.poll_interval)
        return {"status": "timeout", "detail": f"not RUNNING after {self.deploy_timeout:.0f}s:\n{detail}\n{STUCK_HINT}"}

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "running":
            raise RayServeDeploymentFailedError(f"Serve deployment {event.get('status')}:\n{event.get('detail')}")
        from tpuflow.rayjob.hooks import RayJobHook

        hook = RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster if isinstance(self.cluster, dict) else None)
        routes = {a["name"]: a.get("route_prefix", "/") for a in self.serve_config.get("applications", [])}
        self.log.info("Serve applications RUNNING: %s at %s", routes, hook.serve_url)
        return {"serve_url": hook.serve_url, "routes": routes}


class ServeEndpointSmokeTestOperator(BaseOperator):
    """POST a request to a deployed endpoint and check the answer contains what it should.

    Retries for `timeout` seconds: proxies can accept traffic a moment after the app is RUNNING.
    """

    template_fields: Sequence[str] = ("url", "payload", "expect")
    template_fields_renderers = {"payload": "json"}

    def __init__(
        self,
        *,
        url: str,
        payload: dict[str, Any],
        expect: str,
        timeout: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.payload = payload
        self.expect = expect
        self.timeout = timeout

    def execute(self, context: Context) -> dict[str, Any]:
        import requests

        deadline = time.time() + self.timeout
        last = ""
        while True:
            try:
                resp = requests.post(self.url, json=self.payload, timeout=30)
                last = f"{resp.status_code}: {resp.text[:1000]}"
                if resp.ok and str(self.expect) in resp.text:
                    self.log.info("Smoke test passed: %s -> %s", json.dumps(self.payload), resp.text[:500])
                    return resp.json()
            except requests.RequestException as err:
                last = str(err)
            if time.time() > deadline:
                raise RayServeDeploymentFailedError(
                    f"endpoint {self.url} did not answer with {self.expect!r} within {self.timeout:.0f}s; last: {last}"
                )
            time.sleep(2)
