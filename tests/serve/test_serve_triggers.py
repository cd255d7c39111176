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
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from support.airflow_context import task_context
from support.json_http import answer_json, serving

from tpuflow.errors import UserInputError
from tpuflow.serve.operators import RayServeDeployOperator
from tpuflow.serve.triggers import RayServeApplicationsTrigger

CONFIG = {"applications": [{"name": "llm", "import_path": "workloads.serve:app", "route_prefix": "/"}]}


class FakeDashboard:
    """GET/PUT/DELETE /api/serve/applications/; PUT apps stay DEPLOYING (a replica waiting for TPUs)
    unless ``put_status`` says otherwise."""

    def __init__(self) -> None:
        self.apps: dict[str, dict[str, Any]] = {}
        self.put_status = "DEPLOYING"
        self.calls: list[str] = []
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, body: Any) -> None:
                answer_json(self, body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path == "/api/ray/version":  # Ray's ServeSubmissionClient checks it first
                    self._answer({"ray_version": "2.60.0", "version": "2.60.0"})
                    return
                dashboard.calls.append("GET")
                self._answer({"applications": dashboard.apps})

            def do_PUT(self) -> None:  # noqa: N802
                dashboard.calls.append("PUT")
                config = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                dashboard.apps = {
                    a["name"]: {"status": dashboard.put_status, "message": "", "deployments": {}}
                    for a in config["applications"]
                }
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
    with serving(fake.server):
        yield fake


def deploy_op(dashboard: FakeDashboard, **kwargs: Any) -> RayServeDeployOperator:
    return RayServeDeployOperator(
        task_id="deploy", serve_config=CONFIG, cluster=dashboard.cluster, poll_interval=0.05, **kwargs
    )


def deferred_trigger(op: RayServeDeployOperator) -> RayServeApplicationsTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context())
    return rebuilt(deferred.value)


def rebuilt(deferred: TaskDeferred) -> RayServeApplicationsTrigger:
    """The deferred trigger as the triggerer builds it: from its serialized kwargs."""
    classpath, kwargs = deferred.trigger.serialize()
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
    asyncio.run(
        RayServeApplicationsTrigger(app_names=["llm"], cluster=dashboard.cluster, delete_on_kill=["llm"]).on_kill()
    )
    # A trigger serialized before delete_on_kill existed deletes nothing either.
    asyncio.run(RayServeApplicationsTrigger(app_names=["llm"], cluster=dashboard.cluster).on_kill())

    assert sorted(dashboard.apps) == ["llm", "other"] and "DELETE" not in dashboard.calls


def test_killing_the_deploy_waiting_in_the_worker_deletes_the_apps_it_created(dashboard):
    op = deploy_op(dashboard, deferrable=False, deploy_timeout=3)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            op.execute(task_context())
        except BaseException as err:  # the wait times out once its apps are gone
            failure.append(err)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while op._owned is None or not dashboard.apps:  # ownership recorded, then the PUT answered
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.02)
    assert sorted(dashboard.apps) == ["llm"]

    op.on_kill()  # what the task runner's SIGTERM handler calls

    assert dashboard.apps == {} and dashboard.calls.count("DELETE") == 1
    worker.join(timeout=10)
    assert failure and isinstance(failure[0], AirflowException) and "Serve deployment: timeout" in str(failure[0])


def outcome(dashboard: FakeDashboard, deferrable: bool) -> tuple[str, Any]:
    """The deploy task's outcome: ("result", value) or (exception class name, message); deferred, the
    trigger's event goes to a fresh operator's execute_complete, as the worker that resumes does."""
    try:
        try:
            return "result", deploy_op(dashboard, deferrable=deferrable, deploy_timeout=1).execute(task_context())
        except TaskDeferred as deferred:
            event = asyncio.run(rebuilt(deferred).run().__anext__()).payload
            return "result", deploy_op(dashboard, deferrable=deferrable).execute_complete(task_context(), event)
    except AirflowException as err:
        return type(err).__name__, str(err)


@pytest.mark.parametrize(
    ("put_status", "expected"),
    [("RUNNING", "result"), ("DEPLOY_FAILED", "AirflowException"), ("DEPLOYING", "AirflowException")],
)
def test_the_worker_and_the_deferred_path_reach_the_same_outcome(dashboard, put_status, expected):
    dashboard.put_status = put_status
    sync = outcome(dashboard, deferrable=False)
    dashboard.apps = {}
    assert outcome(dashboard, deferrable=True) == sync
    assert sync[0] == expected
    if expected == "result":
        assert sync[1] == {"serve_url": "http://127.0.0.1:1", "routes": {"llm": "/"}}
    else:
        assert f"application llm: {put_status}" in sync[1]
    if put_status == "DEPLOYING":
        assert "timeout" in sync[1] and "declare the slice topology" in sync[1], "a stuck deploy says why"


def test_on_kill_action_keep_leaves_the_apps_serving_when_the_task_is_killed(dashboard):
    trigger = deferred_trigger(deploy_op(dashboard, deferrable=True, on_kill_action="keep"))
    assert trigger.delete_on_kill is None
    asyncio.run(trigger.on_kill())
    assert sorted(dashboard.apps) == ["llm"]

    dashboard.apps = {}
    op = deploy_op(dashboard, deferrable=False, deploy_timeout=1, on_kill_action="keep")
    failure: list[BaseException] = []

    def work() -> None:
        try:
            op.execute(task_context())
        except BaseException as err:  # the wait times out: the apps stay DEPLOYING
            failure.append(err)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while "PUT" not in dashboard.calls:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    op.on_kill()
    worker.join(timeout=10)
    assert sorted(dashboard.apps) == ["llm"] and "DELETE" not in dashboard.calls
    assert failure and isinstance(failure[0], AirflowException)

    with pytest.raises(UserInputError) as err:
        deploy_op(dashboard, on_kill_action="remove")
    assert err.value.field == "on_kill_action"


def test_a_templated_serve_config_is_checked_once_rendered(dashboard):
    with pytest.raises(UserInputError) as err:
        RayServeDeployOperator(task_id="deploy", serve_config={"apps": []}, cluster=dashboard.cluster)
    assert err.value.field == "serve_config"
    op = RayServeDeployOperator(task_id="deploy", serve_config="{{ params.config }}", cluster=dashboard.cluster)
    op.render_template_fields({"params": {"config": "not a config"}})
    with pytest.raises(UserInputError) as err:
        op.execute(task_context())
    assert err.value.field == "serve_config" and dashboard.calls == [], "nothing deployed, nothing asked"


def test_running_apps_end_the_deferred_task_in_the_triggerer_with_the_value_execute_complete_returns(dashboard):
    from support.triggerer import first_event

    from tpuflow.triggers import TaskEndedEvent

    op = deploy_op(dashboard, deferrable=True)
    trigger = deferred_trigger(op)
    dashboard.apps["llm"]["status"] = "RUNNING"
    event, stored = first_event(trigger)
    assert isinstance(event, TaskEndedEvent)
    assert stored["return_value"] == op.execute_complete(task_context(), event.payload)
    assert stored["return_value"] == {"serve_url": "http://127.0.0.1:1", "routes": {"llm": "/"}}
