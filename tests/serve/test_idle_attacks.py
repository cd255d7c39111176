"""A kept endpoint's idle watch against the people who can reach the endpoint or answer its metrics.

A double of a Ray head as Ray 2.60's Serve behaves: its proxy answers the app (200 with the endpoint's bearer
token, 401 without, as tpuflow's apps do), counting each answer in ``ray_serve_num_http_requests_total`` by
application and status code and each request while it is being answered in the ongoing gauge; its Prometheus
exporter writes those series (tests/serve/test_idle_stop_on_ray.py checks the same on a real Serve). The
attacks are plain HTTP: calls without the token, a request whose body never comes, a user calling without
pause; and a metrics answer that never ends, or trickles. The watch runs as in Airflow: the operator defers,
and the trigger rebuilt from its serialized kwargs runs its own wait.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from airflow.sdk.exceptions import TaskDeferred
from support.airflow_context import task_context
from support.json_http import serving

from tpuflow.errors import UserInputError
from tpuflow.serve.idle_stop import RayServeWaitForIdleOperator
from tpuflow.serve.triggers import RayServeIdleTrigger

TOKEN = "the-endpoint-token"
LIFETIME_VARIABLE = "AIRFLOW_VAR_TPUFLOW_MAX_KEPT_ENDPOINT_HOURS"
# A hang guard, not a measure: a watch an attack holds off would otherwise never end.
GUARD_S = 30.0
WINDOW = {"idle_timeout_minutes": 0.01, "poll_interval": 0.05, "margin": 0.2}  # a 0.6 s window, plus 0.2 s


class FakeRayHead:
    """The endpoint (``serve_url``/app) and the head's metrics exporter (``metrics_url``), on loopback."""

    def __init__(self) -> None:
        self.answers: Counter[str] = Counter()  # status code -> answers of the app
        self.ongoing = 0
        self.lock = threading.Lock()
        self.metrics_reads: list[dict[str, str]] = []  # the headers of every metrics request
        self.metrics_answer: Callable[[BaseHTTPRequestHandler], None] | None = None  # None: the exposition
        head = self

        class Proxy(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                with head.lock:
                    head.ongoing += 1
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if len(self.rfile.read(length)) < length:
                        return  # the caller went away mid-body
                    code = 200 if self.headers.get("Authorization") == f"Bearer {TOKEN}" else 401
                    self.send_response(code)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok" if code == 200 else b"no")
                    with head.lock:
                        head.answers[str(code)] += 1
                finally:
                    with head.lock:
                        head.ongoing -= 1

        class Exporter(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                head.metrics_reads.append(dict(self.headers))
                if head.metrics_answer is not None:
                    head.metrics_answer(self)
                    return
                body = head.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
        self.exporter = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
        self.serve_url = f"http://127.0.0.1:{self.proxy.server_address[1]}"
        self.metrics_url = f"http://127.0.0.1:{self.exporter.server_address[1]}/metrics"
        self.cluster = {
            "dashboard_url": "http://127.0.0.1:1",
            "serve_url": self.serve_url,
            "metrics_url": self.metrics_url,
        }

    def exposition(self) -> str:
        """Serve's series as Ray 2.60's exporter writes them (a series appears with its first answer)."""
        tags = 'application="app",method="POST",route="/app"'
        with self.lock:
            lines = [
                "# TYPE ray_serve_num_http_requests_total counter",
                'ray_serve_num_http_requests_total{application="",method="GET",route="/-/healthz",status_code="200"} 9',
                *(
                    f'ray_serve_num_http_requests_total{{{tags},status_code="{c}"}} {n}'
                    for c, n in self.answers.items()
                ),
                "# TYPE ray_serve_num_ongoing_http_requests gauge",
                f'ray_serve_num_ongoing_http_requests{{node_id="n",node_ip_address="127.0.0.1"}} {self.ongoing}',
            ]
        return "\n".join(lines) + "\n"

    def call(self, token: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.post(f"{self.serve_url}/app", data=b"{}", headers=headers, timeout=10).status_code

    @contextmanager
    def calling(self, token: str | None = None) -> Iterator[list[int]]:
        """Someone calling the endpoint without pause while in the block; the answers' status codes."""
        stop, codes = threading.Event(), []

        def caller() -> None:
            while not stop.is_set():
                codes.append(self.call(token))
                time.sleep(0.01)

        thread = threading.Thread(target=caller, daemon=True)
        thread.start()
        try:
            yield codes
        finally:
            stop.set()
            thread.join()

    @contextmanager
    def held_open(self) -> Iterator[None]:
        """One request whose body never comes, open while in the block."""
        port = self.proxy.server_address[1]
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /app HTTP/1.1\r\nHost: endpoint\r\nContent-Length: 1000\r\n\r\n{")
            deadline = time.time() + GUARD_S
            while self.ongoing < 1 and time.time() < deadline:
                time.sleep(0.01)
            assert self.ongoing == 1
            yield


@pytest.fixture
def head() -> Iterator[FakeRayHead]:
    fake = FakeRayHead()
    with serving(fake.proxy), serving(fake.exporter):
        yield fake


def rebuilt(trigger: Any) -> Any:
    """The trigger as a triggerer builds it: from its serialized kwargs."""
    classpath, kwargs = trigger.serialize()
    module, _, cls = classpath.rpartition(".")
    return getattr(importlib.import_module(module), cls)(**kwargs)


def watch(**kwargs: Any) -> dict[str, Any]:
    """The watch as Airflow runs it: deferred, the rebuilt trigger's event, then execute_complete's verdict."""
    op = RayServeWaitForIdleOperator(task_id="serve_until_idle", keep=True, **kwargs)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context())
    trigger = rebuilt(deferred.value.trigger)

    async def first_event() -> Any:
        return (await asyncio.wait_for(trigger.run().__anext__(), GUARD_S)).payload

    event = asyncio.run(first_event())
    return op.execute_complete(task_context(), event, **(deferred.value.kwargs or {}))


def test_a_stream_of_refused_calls_does_not_keep_the_endpoint(head: FakeRayHead) -> None:
    assert head.call(TOKEN) == 200  # someone used it once
    with head.calling(token=None) as codes:  # then someone without the token calls it without pause
        verdict = watch(cluster=head.cluster, **WINDOW)
    assert verdict["keep"] is False and verdict["stopped"] == "idle", verdict
    assert verdict["requests"] == 1 and len(codes) > 10 and set(codes) == {401}


def test_one_request_held_open_past_the_window_does_not_keep_the_endpoint(head: FakeRayHead) -> None:
    with head.held_open():
        verdict = watch(cluster=head.cluster, **WINDOW)
        assert head.ongoing == 1  # still in flight when the watch let the endpoint go
    assert verdict["keep"] is False and verdict["stopped"] == "idle", verdict


def test_an_endpoint_in_use_without_pause_still_stops_at_the_admins_lifetime(
    head: FakeRayHead, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(LIFETIME_VARIABLE, str(1.5 / 3600))  # the admin's Variable: 1.5 s
    with head.calling(token=TOKEN) as codes:
        verdict = watch(cluster=head.cluster, **WINDOW)
        answered = len(codes)
    assert verdict["keep"] is False and verdict["stopped"] == "lifetime", verdict
    assert answered > 10 and set(codes) == {200}  # it was busy to the end
    assert verdict["reason"].startswith("lifetime: kept 0.000416667 h")
    said = [line for line in capsys.readouterr().out.splitlines() if "Stopping the kept endpoint" in line]
    assert len(said) == 1 and "lifetime" in said[0], said


@pytest.mark.parametrize("asked", [1e9, "1000000", None])
def test_no_argument_or_rendered_param_keeps_an_endpoint_past_the_admins_lifetime(
    head: FakeRayHead, monkeypatch: pytest.MonkeyPatch, asked: Any
) -> None:
    monkeypatch.setenv(LIFETIME_VARIABLE, "2")
    op = RayServeWaitForIdleOperator(task_id="w", cluster=head.cluster, keep=True, max_lifetime_hours=asked, **WINDOW)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context())
    trigger = deferred.value.trigger
    assert trigger.deadline - trigger.since == pytest.approx(2 * 3600)


@pytest.mark.parametrize("asked", [float("inf"), "inf", "nan", -1, 0, "forever"])
def test_an_endless_or_bad_lifetime_is_one_line_naming_it(head: FakeRayHead, asked: Any) -> None:
    with pytest.raises(UserInputError, match=r"^max_lifetime_hours=.* is invalid: give the most hours"):
        RayServeWaitForIdleOperator(task_id="w", cluster=head.cluster, keep=True, max_lifetime_hours=asked, **WINDOW)
    rendered = RayServeWaitForIdleOperator(task_id="w", cluster=head.cluster, keep=True, max_lifetime_hours="{{ x }}")
    rendered.max_lifetime_hours = asked  # what a Param's template rendered to
    with pytest.raises(UserInputError, match=r"^max_lifetime_hours=.* is invalid: give the most hours"):
        rendered.execute(task_context())


@pytest.mark.parametrize("value", ["inf", "0", "soon"])
def test_a_bad_lifetime_variable_fails_the_watch_so_the_teardowns_delete(
    head: FakeRayHead, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(LIFETIME_VARIABLE, value)
    op = RayServeWaitForIdleOperator(task_id="w", cluster=head.cluster, keep=True, **WINDOW)
    with pytest.raises(UserInputError, match=r"^Variable tpuflow_max_kept_endpoint_hours=.* is invalid"):
        op.execute(task_context())


def test_kept_without_an_idle_timeout_the_endpoint_still_stops_at_its_lifetime(
    head: FakeRayHead, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LIFETIME_VARIABLE, str(1 / 3600))
    op = RayServeWaitForIdleOperator(task_id="w", cluster=head.cluster, keep=True, idle_timeout_minutes=None)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context())
    trigger = rebuilt(deferred.value.trigger)  # Airflow's own DateTimeTrigger, at the lifetime's end

    async def first_event() -> Any:
        return (await asyncio.wait_for(trigger.run().__anext__(), GUARD_S)).payload

    assert type(trigger).__name__ == "DateTimeTrigger"
    fired = asyncio.run(first_event())
    assert fired == datetime.fromtimestamp(deferred.value.kwargs["deadline"], tz=UTC)
    verdict = op.execute_complete(task_context(), fired, **deferred.value.kwargs)
    assert verdict["keep"] is False and verdict["stopped"] == "lifetime" and head.metrics_reads == []


def test_the_metrics_server_never_sees_the_clusters_token(head: FakeRayHead, monkeypatch: pytest.MonkeyPatch) -> None:
    connection = {"conn_type": "ray", "host": "http://127.0.0.1", "port": 1, "password": "ray-cluster-token",
                  "extra": {"metrics_url": head.metrics_url}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_RAY_IDLE_WATCH", json.dumps(connection))
    verdict = watch(ray_conn_id="ray_idle_watch", **WINDOW)
    assert verdict["stopped"] == "idle" and len(head.metrics_reads) >= 2
    assert not [h for h in head.metrics_reads if any(k.lower() in ("authorization", "cookie") for k in h)]


class Sent:
    """What the metrics answers sent before the reader hung up, one entry a connection."""

    def __init__(self) -> None:
        self.bytes: list[int] = []


def endless_answer(sent: Sent, *, total: int, chunk: bytes, pause: float) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; version=0.0.4")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(b'ray_serve_num_http_requests_total{application="app",status_code="200"} 1\n')
        written = 0
        try:
            while written < total:
                handler.wfile.write(chunk)
                written += len(chunk)
                time.sleep(pause)
        except OSError:  # the reader hung up
            pass
        sent.bytes.append(written)

    return answer


def idle_trigger(head: FakeRayHead, **kwargs: Any) -> RayServeIdleTrigger:
    """The watch's trigger as the operator defers it: the window began now, one successful answer so far."""
    args = {"idle_timeout_s": 0.6, "since": time.time(), "requests": 1, "poll_interval": 0.05, "margin": 0.2}
    return rebuilt(RayServeIdleTrigger(cluster=head.cluster, **args, **kwargs))


def test_a_huge_metrics_answer_is_cut_off_and_counts_as_unreadable(head: FakeRayHead) -> None:
    sent, total = Sent(), 128 * 1024 * 1024
    head.metrics_answer = endless_answer(sent, total=total, chunk=b"# junk " * 150_000 + b"\n", pause=0)
    trigger = idle_trigger(head, unreadable_after=0.3)

    async def first_event() -> Any:
        return (await asyncio.wait_for(trigger.run().__anext__(), GUARD_S)).payload

    event = asyncio.run(first_event())
    assert event["status"] == "error" and event["reason"] == "unreadable", event
    assert "bytes" in event["message"]
    assert sent.bytes and max(sent.bytes) < total  # every read hung up long before the end


def test_a_trickling_metrics_answer_is_cut_off_by_the_wall_clock(head: FakeRayHead) -> None:
    sent = Sent()
    head.metrics_answer = endless_answer(sent, total=600, chunk=b"#", pause=0.05)  # 30 s, a byte at a time
    trigger = idle_trigger(head, unreadable_after=0.2, metrics_timeout=0.3)

    async def first_event() -> Any:
        return (await asyncio.wait_for(trigger.run().__anext__(), GUARD_S)).payload

    event = asyncio.run(first_event())
    assert event["status"] == "error" and event["reason"] == "unreadable", event
    assert "no whole answer" in event["message"]
    deadline = time.time() + GUARD_S
    while len(sent.bytes) < len(head.metrics_reads) and time.time() < deadline:
        time.sleep(0.05)  # the answers notice the reader hung up at their next byte
    assert sent.bytes and max(sent.bytes) < 600


def test_the_addition_app_gives_no_successful_answer_without_its_token() -> None:
    """What the watch counts as use (2xx) a caller without the token cannot get from the shipped app: FastAPI's
    pages, which answer anyone, are off (its API routes answer 401: tests/serve/test_endpoint_token.py)."""
    from fastapi.testclient import TestClient

    workloads = str(Path(__file__).resolve().parents[2] / "workloads")
    if workloads not in sys.path:
        sys.path.insert(0, workloads)
    from addition.serve_app import app

    anyone = TestClient(app)
    for page in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert anyone.get(page).status_code == 404, page


def test_the_watch_and_the_budget_read_the_same_admin_lifetime() -> None:
    """One admin knob: the Variable the watch stops a kept endpoint at is the one that bounds its GKE pool."""
    from tpuflow import limits
    from tpuflow.serve import idle_stop

    assert idle_stop.LIFETIME_VARIABLE == limits.MAX_KEPT_ENDPOINT_VARIABLE
    assert idle_stop.DEFAULT_LIFETIME_HOURS == limits.DEFAULT_MAX_KEPT_ENDPOINT_HOURS
