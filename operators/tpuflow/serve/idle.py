"""When a kept endpoint is idle, judged from Ray Serve's own metrics (pure functions; no I/O).

Serve's proxy counts every request it answers in ``ray_serve_num_http_requests_total`` (gRPC:
``ray_serve_num_grpc_requests_total``), labelled with the ``application`` it routed to and the answer's
``status_code``; its health and routes checks (``/-/healthz``, ``/-/routes``: KubeRay's probes among them)
carry an empty application and are not traffic. Only an application's successful answers are work: HTTP 2xx,
gRPC ``OK``. Anyone who can reach the endpoint can make it answer 401, 404 or 5xx, so those never keep it.
``ray_serve_num_ongoing_http_requests`` is what is in flight. tpuflow deploys with ``proxy_location:
HeadOnly``, so one proxy, on the head, sees every request through the endpoint, and the head's Prometheus
exporter (Ray's ``--metrics-export-port``; 8080 on KubeRay) is the one place to read.

Ray exports a process's metrics every few seconds, so a count lags the requests by that much; the watch
adds ``margin_s`` to the window for it. A count that changes at all (a head restarted counts from 0 again)
is activity: the window starts over, so a doubt only ever makes the endpoint live longer.

Requests in flight only defer the stop, and only until they have been seen in flight for a whole window: a
long answer that began before the window ended is not cut, but holding a request open (anyone can send one
and never finish its body) does not keep the endpoint. Every kept endpoint also has a ``deadline`` (its
absolute lifetime): reached, it stops however busy it is.
"""

from __future__ import annotations

from dataclasses import dataclass

REQUEST_COUNTERS = ("ray_serve_num_http_requests", "ray_serve_num_grpc_requests")
ONGOING_GAUGES = ("ray_serve_num_ongoing_http_requests", "ray_serve_num_ongoing_grpc_requests")
SERVE_PREFIX = "ray_serve_num_"  # every series the watch reads starts with it
GRPC_SUCCESS = "OK"  # Serve labels a gRPC answer with its status code's name


@dataclass(frozen=True)
class ServeActivity:
    """What the proxy has served: ``requests``, its applications' successful answers ever (not health checks,
    not errors), and ``ongoing`` requests now."""

    requests: float
    ongoing: float


def is_success(status_code: str | None) -> bool:
    """Whether Serve's ``status_code`` label is a successful answer: HTTP 2xx or gRPC OK."""
    code = status_code or ""
    return code == GRPC_SUCCESS or (len(code) == 3 and code.startswith("2") and code.isdigit())


def serve_activity(text: str) -> ServeActivity:
    """The proxy's successful answers and in-flight requests from a Prometheus text exposition.

    Parsed by prometheus_client (Ray's own exporter library), given only Serve's ``ray_serve_num_*`` lines: the
    head's exposition is several hundred kB of other metrics, and this runs in the triggerer's event loop."""
    from prometheus_client.parser import text_string_to_metric_families

    serve_lines = "\n".join(line for line in text.splitlines() if line.startswith(SERVE_PREFIX))
    requests = ongoing = 0.0
    for family in text_string_to_metric_families(serve_lines):
        for sample in family.samples:
            # Ray's exporter gives counters the _total suffix (OpenTelemetry); older exporters omit it
            name = sample.name.removesuffix("_total")
            if name in ONGOING_GAUGES:
                ongoing += sample.value
            elif (
                name in REQUEST_COUNTERS
                and sample.labels.get("application")
                and is_success(sample.labels.get("status_code"))
            ):
                requests += sample.value
    return ServeActivity(requests=requests, ongoing=ongoing)


@dataclass
class IdleWatch:
    """The idle window and the lifetime of one kept endpoint.

    ``since``: when it last answered successfully (or the watch began); ``requests``: the count then (None: not
    read yet); ``deadline``: epoch seconds its lifetime ends (None: no lifetime, only in unit tests of the
    window); ``held_since``: since when requests have been seen in flight without a pause (None: none now).
    Idle once ``idle_timeout_s`` + ``margin_s`` passed since ``since`` with the count unchanged and nothing in
    flight, or what is in flight has been for a whole window.
    """

    idle_timeout_s: float
    since: float
    requests: float | None = None
    margin_s: float = 30.0
    deadline: float | None = None
    held_since: float | None = None

    def observe(self, activity: ServeActivity, now: float) -> bool:
        """Take one reading; True when it showed a successful answer (the window starts over)."""
        served = self.requests is not None and activity.requests != self.requests
        self.requests = activity.requests
        if activity.ongoing > 0:
            self.held_since = self.held_since if self.held_since is not None else now
        else:
            self.held_since = None
        if served:
            self.since = now
        return served

    def idle_for(self, now: float) -> float:
        return max(0.0, now - self.since)

    def in_flight_holds(self, now: float) -> bool:
        """Whether requests in flight still defer the stop: seen for less than a window."""
        return self.held_since is not None and now - self.held_since < self.idle_timeout_s

    def is_idle(self, now: float) -> bool:
        return self.idle_for(now) >= self.idle_timeout_s + self.margin_s and not self.in_flight_holds(now)

    def is_expired(self, now: float) -> bool:
        """Whether the endpoint reached the end of its lifetime."""
        return self.deadline is not None and now >= self.deadline


def poll_interval_for(idle_timeout_s: float) -> float:
    """How often to read the metrics: a tenth of the window, between 5 s and a minute."""
    return min(60.0, max(5.0, idle_timeout_s / 10))
