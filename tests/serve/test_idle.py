"""Idle judged from Serve's metrics: the exposition's counters and the window (tpuflow.serve.idle)."""

from __future__ import annotations

import pytest

from tpuflow.serve.idle import IdleWatch, ServeActivity, poll_interval_for, serve_activity

LABELS = 'Component="core_worker",SessionName="s",WorkerId="w",method="GET",status_code="200"'


def exposition(
    app_requests: float, health: float = 7, ongoing: float | None = 0, grpc: float = 0, refused: float = 0
) -> str:
    """A head's /metrics as Ray 2.60 writes it (abridged): the proxy's counters among other series."""
    refused_labels = LABELS.replace('status_code="200"', 'status_code="401"')
    lines = [
        "# HELP ray_serve_num_http_requests_total The number of HTTP requests processed.",
        "# TYPE ray_serve_num_http_requests_total counter",
        f'ray_serve_num_http_requests_total{{{LABELS},application="",route="/-/healthz"}} {health}',
        f'ray_serve_num_http_requests_total{{{LABELS},application="addition",route="/addition"}} {app_requests}',
        f'ray_serve_num_http_requests_total{{{refused_labels},application="addition",route="/addition"}} {refused}',
        f'ray_serve_num_router_requests_total{{application="addition",route="/addition"}} {app_requests * 3}',
        'ray_node_cpu_utilization{instance="127.0.0.1"} 12.5',
    ]
    if grpc:
        lines.append(f'ray_serve_num_grpc_requests_total{{application="llm",method="/x",status_code="OK"}} {grpc}')
    if ongoing is not None:
        lines.append(f'ray_serve_num_ongoing_http_requests{{node_id="n",node_ip_address="127.0.0.1"}} {ongoing}')
    return "\n".join(lines) + "\n"


def test_requests_are_the_applications_successful_answers_never_health_checks_or_refusals() -> None:
    assert serve_activity(exposition(3, health=500, refused=900)) == ServeActivity(requests=3, ongoing=0)
    assert serve_activity(exposition(3, grpc=2, ongoing=1)) == ServeActivity(requests=5, ongoing=1)
    # before the first request Ray has no series at all; a gauge that expired is no request in flight
    assert serve_activity("ray_node_cpu_utilization 1\n") == ServeActivity(requests=0, ongoing=0)
    assert serve_activity(exposition(3, ongoing=None)).ongoing == 0
    # an exporter without the _total suffix counts the same; a count without a status code is no success
    assert serve_activity('ray_serve_num_http_requests{application="a",status_code="204"} 4\n').requests == 4
    assert serve_activity('ray_serve_num_http_requests{application="a"} 4\n').requests == 0
    grpc = 'ray_serve_num_grpc_requests_total{application="llm",status_code="%s"} 6\n'
    assert serve_activity(grpc % "OK").requests == 6 and serve_activity(grpc % "UNAUTHENTICATED").requests == 0


def test_the_window_starts_over_at_each_successful_answer_and_in_flight_requests_defer_it_one_window() -> None:
    watch = IdleWatch(idle_timeout_s=60, since=1000, requests=3, margin_s=10)
    assert not watch.observe(ServeActivity(3, 0), 1030)
    assert not watch.is_idle(1069) and watch.is_idle(1070)  # the window plus the export margin
    assert watch.observe(ServeActivity(4, 0), 1040)  # an answer: the window starts again
    assert watch.since == 1040 and not watch.is_idle(1100) and watch.is_idle(1110)
    assert not watch.observe(ServeActivity(4, 1), 1105)  # a long request still running: no answer yet
    assert watch.idle_for(1110) == 70 and not watch.is_idle(1110)  # but it defers the stop
    watch.observe(ServeActivity(4, 1), 1160)
    assert not watch.is_idle(1164) and watch.is_idle(1165)  # for one window from when it was seen, no more
    watch.observe(ServeActivity(4, 0), 1170)  # it ended without a successful answer: nothing held
    assert watch.held_since is None and watch.is_idle(1170)


def test_the_lifetime_ends_a_busy_endpoint() -> None:
    watch = IdleWatch(idle_timeout_s=60, since=0, requests=0, margin_s=0, deadline=100)
    assert watch.observe(ServeActivity(1, 0), 99) and not watch.is_expired(99)
    assert watch.is_expired(100) and not watch.is_idle(100)


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
