"""A wall-clock deadline on each whole HTTP request of the Airflow side's storage clients.

requests' ``timeout=`` bounds each wait for the next bytes, not the request: a server (or proxy) that sends one
byte every half second holds a read for as long as it likes, and the task, its slice and its bill with it. Here the
request has a deadline from the moment it is sent to the last byte of its answer: when it passes, the request's
socket is shut down (what is blocked reading it returns at once) and the request fails with RequestDeadlineExceeded,
a TimeoutError: google-cloud-storage's retry predicates do not retry it, the caller's (and the task's) retries decide.

Installed on a client's ``requests`` session (bound_session); every request of that session has the deadline,
whatever code calls it (storage helpers, slice leases, supervision records, the outputs page, the reaper).
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class RequestDeadlineExceeded(TimeoutError):
    """One HTTP request did not finish (its whole answer read) within its deadline (tpuflow.storage's calls raise
    it as their StorageTimeout, naming the path)."""


class _Watch:
    """One request's deadline and the socket it is using."""

    def __init__(self, what: str, seconds: float) -> None:
        self.what, self.seconds = what, seconds
        self.deadline = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.sock: Any = None
        self.fired = self.done = False

    def attach(self, sock: Any) -> None:
        with self.lock:
            if self.done:
                return
            self.sock = sock
            if self.fired:
                _shut(sock)

    def fire(self) -> None:
        with self.lock:
            if self.done:
                return
            self.fired = True
            if self.sock is not None:
                _shut(self.sock)

    def finish(self) -> None:
        with self.lock:
            self.done = True

    def error(self) -> RequestDeadlineExceeded:
        return RequestDeadlineExceeded(f"{self.what}: the server did not finish answering within {self.seconds:g} s")


def _shut(sock: Any) -> None:
    """Shut the socket down for both directions: a read blocked on it (in another thread) returns at once. The
    plain socket's shutdown also for a TLS socket, whose own shutdown would first drop its TLS state."""
    if isinstance(sock, socket.socket):
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass  # closed meanwhile


class _Watchdog:
    """One daemon thread firing the watches whose deadline passed (finished ones are dropped when their turn comes)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, watch: _Watch) -> None:
        with self._wake:
            heapq.heappush(self._heap, (watch.deadline, next(self._order), watch))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tpuflow-request-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._wake.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                _, _, watch = heapq.heappop(self._heap)
            watch.fire()


_WATCHDOG = _Watchdog()
_current = threading.local()  # the watch of the request this thread is sending


def _attach(sock: Any) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.attach(sock)


class _ReportsItsSocket:
    """Reports its socket to the request being sent (a new connection, or a kept-alive one reused)."""

    sock: Any

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        _attach(self.sock)

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None:
            _attach(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


class _WatchedHTTPConnection(_ReportsItsSocket, HTTPConnection):
    pass


class _WatchedHTTPSConnection(_ReportsItsSocket, HTTPSConnection):
    pass


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


def _watched_pools(manager: Any) -> Any:
    manager.pool_classes_by_scheme = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}
    return manager


def _converting(method: Callable[..., Any], watch: _Watch) -> Callable[..., Any]:
    """``method`` raising the watch's error when it failed because the deadline shut its socket."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as err:
            if watch.fired:
                raise watch.error() from err
            raise

    return call


def _ending(method: Callable[..., Any], watch: _Watch) -> Callable[..., Any]:
    """``method`` (the answer's release or close) ending the request's deadline first."""

    def call(*args: Any, **kwargs: Any) -> Any:
        watch.finish()
        return method(*args, **kwargs)

    return call


def _guard_answer(raw: Any, watch: _Watch) -> None:
    """Reading the answer's body is part of the request: its reads fail with the deadline's error once it passed;
    reading it to its end (urllib3 then releases the connection) or closing it ends the deadline."""
    for name in ("read", "read1", "read_chunked"):
        if callable(getattr(raw, name, None)):
            setattr(raw, name, _converting(getattr(raw, name), watch))
    for name in ("release_conn", "close"):
        if callable(getattr(raw, name, None)):
            setattr(raw, name, _ending(getattr(raw, name), watch))


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter with a wall-clock deadline (``seconds()``, read per request) on each whole request."""

    def __init__(self, seconds: Callable[[], float], **kwargs: Any) -> None:
        self.seconds = seconds
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        _watched_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        return _watched_pools(manager) if proxy.lower().startswith("http") else manager

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        watch = _Watch(f"{request.method} {str(request.url).split('?', 1)[0]}", self.seconds())
        _WATCHDOG.arm(watch)
        previous, _current.watch = getattr(_current, "watch", None), watch
        try:
            response = super().send(request, *args, **kwargs)
        except Exception as err:
            watch.finish()
            if watch.fired:
                raise watch.error() from err
            raise
        finally:
            _current.watch = previous
        _guard_answer(response.raw, watch)
        return response


def bound_session(session: Any, seconds: Callable[[], float]) -> None:
    """Give every request of the ``requests`` session (and of the one its credentials refresh through, where it
    has one) the wall-clock deadline. Adapters of another kind (mutual TLS) are left as they are."""
    sessions = [session, getattr(getattr(session, "_auth_request", None), "session", None)]
    for each in sessions:
        if not isinstance(each, requests.Session):
            continue
        for prefix in ("https://", "http://"):
            if type(each.adapters.get(prefix)) is HTTPAdapter:
                each.mount(prefix, DeadlineAdapter(seconds))
