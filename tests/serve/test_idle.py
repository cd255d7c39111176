"""Idle judged from Serve's metrics: the exposition's counters and the window (tpuflow.serve.idle)."""

from __future__ import annotations

import pytest

from tpuflow.serve.idle import IdleWatch, ServeActivity, poll_interval_for, serve_activity

LABELS = 'Component="core_worker",SessionName="s",WorkerId="w",method="GET",status_code="200"'


def exposition(app_requests: float, health: float = 7, ongoing: float | None = 0, grpc: float = 0) -> str:
    """A head's /metrics as Ray 2.60 writes it (abridged): the proxy's counters among other series."""
    lines = [
        "# HELP ray_serve_num_http_requests_total The number of HTTP requests processed.",
        "# TYPE ray_serve_num_http_requests_total counter",
        f'ray_serve_num_http_requests_total{{{LABELS},application="",route="/-/healthz"}} {health}',
        f'ray_serve_num_http_requests_total{{{LABELS},application="addition",route="/addition"}} {app_requests}',
        f'ray_serve_num_router_requests_total{{application="addition",route="/addition"}} {app_requests * 3}',
        'ray_node_cpu_utilization{instance="127.0.0.1"} 12.5',
    ]
    if grpc:
        lines.append(f'ray_serve_num_grpc_requests_total{{application="llm",method="/x",status_code="OK"}} {grpc}')
    if ongoing is not None:
        lines.append(f'ray_serve_num_ongoing_http_requests{{node_id="n",node_ip_address="127.0.0.1"}} {ongoing}')
    return "\n".join(lines) + "\n"


def test_requests_are_what_the_proxy_routed_to_applications_never_its_health_checks() -> None:
    assert serve_activity(exposition(3, health=500)) == ServeActivity(requests=3, ongoing=0)
    assert serve_activity(exposition(3, grpc=2, ongoing=1)) == ServeActivity(requests=5, ongoing=1)
    # before the first request Ray has no series at all; a gauge that expired is no request in flight
    assert serve_activity("ray_node_cpu_utilization 1\n") == ServeActivity(requests=0, ongoing=0)
    assert serve_activity(exposition(3, ongoing=None)).ongoing == 0
    # an exporter without the _total suffix counts the same
    assert serve_activity('ray_serve_num_http_requests{application="a"} 4\n').requests == 4


def test_the_window_starts_over_at_each_request_and_in_flight_request() -> None:
    watch = IdleWatch(idle_timeout_s=60, since=1000, requests=3, margin_s=10)
    assert not watch.observe(ServeActivity(3, 0), 1030)
    assert not watch.is_idle(1069) and watch.is_idle(1070)  # the window plus the export margin
    assert watch.observe(ServeActivity(4, 0), 1040)  # a request: the window starts again
    assert watch.since == 1040 and not watch.is_idle(1100) and watch.is_idle(1110)
    assert watch.observe(ServeActivity(4, 1), 1105)  # a long request still running: busy
    assert not watch.is_idle(1110) and watch.idle_for(1110) == 5


def test_a_count_that_goes_down_is_a_restarted_head_and_counts_as_activity() -> None:
    watch = IdleWatch(idle_timeout_s=60, since=0, requests=9, margin_s=0)
    assert watch.observe(ServeActivity(0, 0), 50) and watch.since == 50 and watch.requests == 0


def test_a_first_reading_sets_the_count_and_keeps_the_window() -> None:
    watch = IdleWatch(idle_timeout_s=60, since=0, requests=None, margin_s=0)
    assert not watch.observe(ServeActivity(12, 0), 30)
    assert watch.requests == 12 and watch.since == 0 and watch.is_idle(60)


@pytest.mark.parametrize(("window", "interval"), [(6, 5.0), (300, 30.0), (3600, 60.0)])
def test_reads_a_tenth_of_the_window_apart_between_5_and_60_seconds(window: float, interval: float) -> None:
    assert poll_interval_for(window) == interval
