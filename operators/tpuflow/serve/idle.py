"""When a kept endpoint is idle, judged from Ray Serve's own metrics (pure functions; no I/O).

Serve's proxy counts every request it answers in ``ray_serve_num_http_requests_total`` (gRPC:
``ray_serve_num_grpc_requests_total``), labelled with the ``application`` it routed to; its health and routes
checks (``/-/healthz``, ``/-/routes``: KubeRay's probes among them) carry an empty application and are not
traffic. ``ray_serve_num_ongoing_http_requests`` is what is in flight. tpuflow deploys with
``proxy_location: HeadOnly``, so one proxy, on the head, sees every request through the endpoint, and the
head's Prometheus exporter (Ray's ``--metrics-export-port``; 8080 on KubeRay) is the one place to read.

Ray exports a process's metrics every few seconds, so a count lags the requests by that much; the watch
adds ``margin_s`` to the window for it. A count that changes at all (a head restarted counts from 0 again)
is activity: the window starts over, so a doubt only ever makes the endpoint live longer.
"""

from __future__ import annotations

from dataclasses import dataclass

REQUEST_COUNTERS = ("ray_serve_num_http_requests", "ray_serve_num_grpc_requests")
ONGOING_GAUGES = ("ray_serve_num_ongoing_http_requests", "ray_serve_num_ongoing_grpc_requests")


@dataclass(frozen=True)
class ServeActivity:
    """What the proxy has served: ``requests`` to applications ever (not health checks), ``ongoing`` now."""

    requests: float
    ongoing: float


def serve_activity(text: str) -> ServeActivity:
    """The proxy's request count and in-flight requests from a Prometheus text exposition.

    Parsed by prometheus_client (Ray's own exporter library), given only Serve's ``ray_serve_num_*`` lines: the
    head's exposition is several hundred kB of other metrics, and this runs in the triggerer's event loop."""
    from prometheus_client.parser import text_string_to_metric_families

    serve_lines = "\n".join(line for line in text.splitlines() if line.startswith("ray_serve_num_"))
    requests = ongoing = 0.0
    for family in text_string_to_metric_families(serve_lines):
        for sample in family.samples:
            # Ray's exporter gives counters the _total suffix (OpenTelemetry); older exporters omit it
            name = sample.name.removesuffix("_total")
            if name in ONGOING_GAUGES:
                ongoing += sample.value
            elif name in REQUEST_COUNTERS and sample.labels.get("application"):
                requests += sample.value
    return ServeActivity(requests=requests, ongoing=ongoing)


@dataclass
class IdleWatch:
    """The idle window of one endpoint.

    ``since``: when it was last seen busy (or the watch began); ``requests``: the count then (None: not read
    yet). Idle once ``idle_timeout_s`` + ``margin_s`` passed since then with the count unchanged and nothing in
    flight.
    """

    idle_timeout_s: float
    since: float
    requests: float | None = None
    margin_s: float = 30.0

    def observe(self, activity: ServeActivity, now: float) -> bool:
        """Take one reading; True when it showed activity (the window starts over)."""
        busy = activity.ongoing > 0 or (self.requests is not None and activity.requests != self.requests)
        self.requests = activity.requests
        if busy:
            self.since = now
        return busy

    def idle_for(self, now: float) -> float:
        return max(0.0, now - self.since)

    def is_idle(self, now: float) -> bool:
        return self.idle_for(now) >= self.idle_timeout_s + self.margin_s


def poll_interval_for(idle_timeout_s: float) -> float:
    """How often to read the metrics: a tenth of the window, between 5 s and a minute."""
    return min(60.0, max(5.0, idle_timeout_s / 10))
