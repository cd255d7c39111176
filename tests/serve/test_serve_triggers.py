"""Kill semantics of the Serve deploy: a scripted Ray dashboard (Serve REST API only), no Ray cluster.

Marking the deploy task failed/success or clearing it deletes the applications the task created, through
the trigger's on_kill when it is deferred and the operator's on_kill when it waits in the worker; an app
it only updated keeps serving, and a triggerer restart (cancel + cleanup) deletes nothing.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from tpuflow.serve.operators import RayServeDeploymentFailedError, RayServeDeployOperator
from tpuflow.serve.triggers import RayServeApplicationsTrigger

CONFIG = {"applications": [{"name": "llm", "import_path": "workloads.serve:app", "route_prefix": "/"}]}


class FakeDashboard:
    """GET/PUT/DELETE /api/serve/applications/; PUT apps stay DEPLOYING (a replica waiting for TPUs)."""

    def __init__(self) -> None:
        self.apps: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                dashboard.calls.append("GET")
                self._answer({"applications": dashboard.apps})

            def do_PUT(self) -> None:  # noqa: N802
                dashboard.calls.append("PUT")
                config = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                dashboard.apps = {a["name"]: {"status": "DEPLOYING", "deployments": {}} for a in config["applications"]}
                self._answer({})

            def do_DELETE(self) -> None:  # noqa: N802
                dashboard.calls.append("DELETE")
                dashboard.apps = {}
                self._answer({})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.cluster = {"dashboard_url": self.url, "serve_url": "http://127.0.0.1:1"}


@pytest.fixture
def dashboard() -> Iterator[FakeDashboard]:
    fake = FakeDashboard()
    thread = threading.Thread(target=fake.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


class FakeTI:
    def xcom_push(self, key: str, value: Any) -> None:
        json.dumps(value)


def deploy_op(dashboard: FakeDashboard, **kwargs: Any) -> RayServeDeployOperator:
    return RayServeDeployOperator(task_id="deploy", serve_config=CONFIG, cluster=dashboard.cluster,
                                  poll_interval=0.05, **kwargs)


def deferred_trigger(op: RayServeDeployOperator) -> RayServeApplicationsTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": FakeTI()})
    classpath, kwargs = deferred.value.trigger.serialize()
    module, _, cls = classpath.rpartition(".")
    return getattr(importlib.import_module(module), cls)(**json.loads(json.dumps(kwargs)))


def test_killing_the_deferred_deploy_deletes_the_apps_it_created_but_a_triggerer_restart_does_not(dashboard):
    trigger = deferred_trigger(deploy_op(dashboard, deferrable=True))
    assert trigger.delete_on_kill == ["llm"]

    async def scenario() -> tuple[list[str], list[str]]:
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.2)
        waiting.cancel()  # a triggerer restart: the wait is cancelled and cleaned up, never killed
        await asyncio.gather(waiting, return_exceptions=True)
        await trigger.cleanup()
        after_restart = sorted(dashboard.apps)
        await trigger.on_kill()  # the user marks the task failed (or success, or clears it)
        return after_restart, sorted(dashboard.apps)

    assert asyncio.run(scenario()) == (["llm"], [])
    assert dashboard.calls.count("DELETE") == 1


def test_killing_a_deploy_that_only_updated_an_app_leaves_it_serving(dashboard):
    dashboard.apps = {"llm": {"status": "RUNNING", "deployments": {}}}  # an endpoint an earlier run deployed
    trigger = deferred_trigger(deploy_op(dashboard, deferrable=True))
    assert trigger.delete_on_kill is None
    asyncio.run(trigger.on_kill())

    # Another deploy's app on the cluster: Serve's REST API can only delete all, so nothing is deleted.
    dashboard.apps["other"] = {"status": "RUNNING", "deployments": {}}
    asyncio.run(RayServeApplicationsTrigger(app_names=["llm"], cluster=dashboard.cluster,
                                            delete_on_kill=["llm"]).on_kill())
    # A trigger serialized before delete_on_kill existed deletes nothing either.
    asyncio.run(RayServeApplicationsTrigger(app_names=["llm"], cluster=dashboard.cluster).on_kill())

    assert sorted(dashboard.apps) == ["llm", "other"] and "DELETE" not in dashboard.calls


def test_killing_the_deploy_waiting_in_the_worker_deletes_the_apps_it_created(dashboard):
    op = deploy_op(dashboard, deferrable=False, deploy_timeout=3)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            op.execute({"ti": FakeTI()})
        except BaseException as err:  # the wait times out once its apps are gone
            failure.append(err)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while getattr(op, "_kill_with", None) is None:
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.02)
    assert sorted(dashboard.apps) == ["llm"]

    op.on_kill()  # what the task runner's SIGTERM handler calls

    assert dashboard.apps == {} and dashboard.calls.count("DELETE") == 1
    worker.join(timeout=10)
    assert failure and isinstance(failure[0], RayServeDeploymentFailedError)
