"""The kept endpoint's idle watch (RayServeWaitForIdleOperator, RayServeIdleTrigger) against a scripted
Prometheus exporter: what the teardowns are told, the window, a triggerer restart, unreadable metrics."""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
import time
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from support.airflow_context import task_context
from support.json_http import serving

from tpuflow.errors import UserInputError
from tpuflow.serve.idle_stop import NOT_KEPT, RayServeWaitForIdleOperator
from tpuflow.serve.triggers import RayServeIdleTrigger


class FakeExporter:
    """GET /metrics: the proxy's application request counter at ``requests`` (None: the exporter is down)."""

    def __init__(self) -> None:
        self.requests: float | None = 0
        self.reads = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                exporter.reads += 1
                if exporter.requests is None:
                    self.send_error(503)
                    return
                body = (
                    f'ray_serve_num_http_requests_total{{application="",route="/-/healthz",status_code="200"}} '
                    f"{exporter.reads}\n"
                    f'ray_serve_num_http_requests_total{{application="app",route="/app",status_code="200"}} '
                    f"{exporter.requests}\n"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = self.server.server_address[1]
        self.cluster = {"dashboard_url": "http://127.0.0.1:1", "metrics_url": f"http://127.0.0.1:{port}/metrics"}


@pytest.fixture
def exporter() -> Iterator[FakeExporter]:
    fake = FakeExporter()
    with serving(fake.server):
        yield fake


def watch_op(exporter: FakeExporter, **kwargs: Any) -> RayServeWaitForIdleOperator:
    args = {"keep": True, "idle_timeout_minutes": 0.01, "poll_interval": 0.05, "margin": 0.2, **kwargs}  # 0.6 s + 0.2 s
    return RayServeWaitForIdleOperator(task_id="serve_until_idle", cluster=exporter.cluster, **args)


def rebuilt(trigger: RayServeIdleTrigger) -> RayServeIdleTrigger:
    """The trigger as a (restarted) triggerer builds it: from its serialized kwargs."""
    classpath, kwargs = trigger.serialize()
    module, _, cls = classpath.rpartition(".")
    return getattr(importlib.import_module(module), cls)(**json.loads(json.dumps(kwargs)))


@pytest.mark.parametrize("keep", [False, "False", "", None])
def test_an_endpoint_not_kept_is_torn_down_without_reading_anything(exporter: FakeExporter, keep: Any) -> None:
    assert watch_op(exporter, keep=keep).execute(task_context()) == {"keep": False, "reason": NOT_KEPT}
    assert exporter.reads == 0


@pytest.mark.parametrize("idle_timeout", [None, "", "None", 0, "0"])
def test_kept_without_an_idle_timeout_waits_for_its_lifetime_reading_nothing(
    exporter: FakeExporter, idle_timeout: Any
) -> None:
    with pytest.raises(TaskDeferred) as deferred:
        watch_op(exporter, keep="True", idle_timeout_minutes=idle_timeout).execute(task_context())
    assert type(deferred.value.trigger).__name__ == "DateTimeTrigger" and exporter.reads == 0
    assert deferred.value.kwargs["max_lifetime_h"] == 24  # no Variable: the built-in lifetime


@pytest.mark.parametrize("idle_timeout", [-1, "soon", float("nan")])
def test_a_bad_idle_timeout_is_one_line_naming_it(exporter: FakeExporter, idle_timeout: Any) -> None:
    with pytest.raises(
        UserInputError, match=r"^idle_timeout_minutes=.* is invalid: give the minutes without a request"
    ) as err:
        watch_op(exporter, idle_timeout_minutes=idle_timeout).execute(task_context())
    assert "\n" not in str(err.value)


def test_a_cluster_without_a_metrics_url_is_one_line_naming_the_fix() -> None:
    op = RayServeWaitForIdleOperator(task_id="w", cluster={"dashboard_url": "http://127.0.0.1:1"}, keep=True,
                                     idle_timeout_minutes=5)  # fmt: skip
    with pytest.raises(UserInputError, match="no metrics_url .*8080 on KubeRay"):
        op.execute(task_context())


def test_in_the_worker_it_ends_only_after_a_whole_quiet_window_since_the_last_request(exporter: FakeExporter) -> None:
    def traffic() -> None:  # a request every 0.2 s for a second, then none
        for _ in range(5):
            time.sleep(0.2)
            exporter.requests = (exporter.requests or 0) + 1

    sender = threading.Thread(target=traffic)
    started = time.time()
    sender.start()
    verdict = watch_op(exporter, deferrable=False).execute(task_context())
    sender.join()
    last_request = started + 1.0
    assert verdict["keep"] is False and verdict["stopped"] == "idle" and verdict["requests"] == 5
    assert verdict["last_busy_at"] >= last_request - 0.1  # it saw the last request
    assert verdict["stopped_at"] - verdict["last_busy_at"] >= 0.6 + 0.2  # then the window and the margin
    assert verdict["reason"] == "idle: no successful answer for 0.01 min (idle_timeout_minutes)"


def test_deferred_the_trigger_keeps_its_window_across_a_triggerer_restart(exporter: FakeExporter) -> None:
    exporter.requests = 3
    with pytest.raises(TaskDeferred) as deferred:
        watch_op(exporter, idle_timeout_minutes=0.05, margin=0).execute(task_context())  # a 3 s window
    trigger = rebuilt(deferred.value.trigger)
    assert trigger.requests == 3 and trigger.idle_timeout_s == 3 and trigger.poll_interval == 0.05
    since = trigger.since
    assert trigger.deadline == since + 24 * 3600  # the lifetime's end is a kwarg too

    async def scenario() -> dict[str, Any]:
        first = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(1.0)
        first.cancel()  # the triggerer restarts: the wait is rebuilt from its kwargs
        await asyncio.gather(first, return_exceptions=True)
        event = await rebuilt(trigger).run().__anext__()
        return event.payload

    event = asyncio.run(scenario())
    # the window still counts from the deploy-time reading: no request since, so it ends 3 s after it
    assert event["status"] == "success" and event["since"] == since and event["requests"] == 3
    assert 3 <= time.time() - since < 6

    exporter.requests = 4  # a request while the rebuilt trigger was down: its window starts at that reading
    event = asyncio.run(rebuilt(trigger).run().__anext__()).payload
    assert event["since"] > since + 3


def test_unreadable_metrics_fail_the_watch_so_the_teardowns_delete(exporter: FakeExporter) -> None:
    op = watch_op(exporter, unreadable_after=0.5)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context())
    exporter.requests = None  # the head is gone
    event = asyncio.run(rebuilt(deferred.value.trigger).run().__anext__()).payload
    assert event["status"] == "error" and event["reason"] == "unreadable" and "503" in event["message"]
    with pytest.raises(AirflowException, match="Stopped watching the kept endpoint: .* it is torn down"):
        op.execute_complete(task_context(), event)


def test_the_old_idle_timeout_keyword_warns_and_is_the_minutes(exporter: FakeExporter) -> None:
    with pytest.warns(
        AirflowProviderDeprecationWarning, match=r"idle_timeout=\.\.\.\) is renamed idle_timeout_minutes"
    ):
        op = RayServeWaitForIdleOperator(task_id="w", cluster=exporter.cluster, keep=True, idle_timeout=5)
    assert op.idle_timeout_minutes == 5 and "idle_timeout_minutes" in op.template_fields
    with pytest.raises(UserInputError, match=r"^idle_timeout=5 is invalid: give idle_timeout_minutes only"):
        RayServeWaitForIdleOperator(task_id="w", keep=True, idle_timeout=5, idle_timeout_minutes=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AirflowProviderDeprecationWarning)
        RayServeWaitForIdleOperator(task_id="w", keep=True, idle_timeout_minutes=5)


def test_the_trigger_serialises_its_window_in_seconds_and_still_rebuilds_from_the_old_keyword(
    exporter: FakeExporter,
) -> None:
    trigger = RayServeIdleTrigger(cluster=exporter.cluster, idle_timeout_s=90, since=1.0)
    classpath, kwargs = trigger.serialize()
    assert kwargs["idle_timeout_s"] == 90 and "idle_timeout" not in kwargs
    assert rebuilt(trigger).idle_timeout_s == 90
    # a trigger the previous release deferred is rebuilt from its stored kwargs, where the window was idle_timeout
    old = {**kwargs, "idle_timeout": kwargs.pop("idle_timeout_s")}
    with pytest.warns(AirflowProviderDeprecationWarning, match=r"idle_timeout=\.\.\.\) is renamed idle_timeout_s"):
        assert RayServeIdleTrigger(**old).idle_timeout_s == 90
    with pytest.raises(TypeError, match="needs idle_timeout_s"):
        RayServeIdleTrigger(since=1.0)
