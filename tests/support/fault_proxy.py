"""A tiny loopback HTTP proxy in front of the GCS emulator that injects faults.

Clients are pointed at it through STORAGE_EMULATOR_HOST. Every request is forwarded unchanged
to the emulator, except the ones a rule picks: those get a 429/503 error answer, a 403, a
connection reset (TCP RST after the request was read), or a stall (the request is read and nothing
is ever sent back, as a server whose log pipe filled or a broken proxy behaves, until the proxy
stops), before the emulator sees them. What was injected is recorded in `injected`, so a test can
show the faults really happened.

Rules match on the method and a "target": the decoded request path (and query) plus the start of
the body, where a multipart upload names its object.

One emulator gap is bridged, for the resumable uploads pyarrow's GCS client makes: after a failed
chunk, the client asks how much the server kept (an empty PUT with `Content-Range: bytes */*`).
Cloud Storage answers 308 with the persisted range; fake-gcs-server (1.x, as bundled) instead
finalises the object with 0 bytes. The proxy knows a chunk it failed never reached the emulator,
so for such an upload it answers that status query as Cloud Storage would: 308, nothing kept.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",
    "host",
}
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Rule:
    """Answer every `every`-th request that `matches` with `fault` (an HTTP status, "reset" or "stall"),
    at most `limit` times (None: no limit)."""

    fault: int | str
    matches: Callable[[str, str], bool]
    every: int = 1
    limit: int | None = None
    seen: int = 0
    fired: int = 0

    def pick(self, method: str, path: str) -> bool:
        if not self.matches(method, path) or (self.limit is not None and self.fired >= self.limit):
            return False
        self.seen += 1
        if self.seen % self.every:
            return False
        self.fired += 1
        return True


@dataclass
class FaultProxy:
    upstream: str  # http://127.0.0.1:PORT of the emulator
    rules: list[Rule] = field(default_factory=list)
    injected: list[tuple[str, str, int | str]] = field(default_factory=list)
    forwarded: int = 0
    resume_queries: int = 0  # status queries of failed resumable uploads answered (see the module doc)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._unsent_uploads: set[str] = set()  # resumable upload ids whose chunk was failed here
        self._released = threading.Event()  # set on stop: stalled requests' connections are closed
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _fault_for(self, method: str, target: str) -> int | str | None:
        with self._lock:
            for rule in self.rules:
                if rule.pick(method, target):
                    self.injected.append((method, target[:1000], rule.fault))
                    return rule.fault
            self.forwarded += 1
        return None

    def _resumable(self, method: str, path: str, headers: Any, body: bytes, fault: int | str | None) -> bool:
        """Track resumable chunks failed here; True when this is a status query to answer with 308."""
        upload = parse_qs(urlsplit(path).query).get("upload_id", [None])[0]
        if method != "PUT" or upload is None:
            return False
        with self._lock:
            if fault is not None:
                self._unsent_uploads.add(upload)
                return False
            if upload not in self._unsent_uploads:
                return False
            if not body and headers.get("Content-Range", "").startswith("bytes */"):
                self.resume_queries += 1
                return True
            self._unsent_uploads.discard(upload)  # the chunk goes through now
            return False


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    up = urlsplit(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _handle(self) -> None:
            body = self._body()
            fault = proxy._fault_for(self.command, f"{unquote(self.path)} {body[:4096].decode('latin-1')}")
            if proxy._resumable(self.command, self.path, self.headers, body, fault):
                self._answer(308, b"", [("Content-Type", "text/plain")])
                return
            if fault == "stall":
                proxy._released.wait()
                self.close_connection = True
                return
            if fault == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            if fault is not None:
                error = {
                    "error": {
                        "code": fault,
                        "message": f"injected by the fault proxy ({fault})",
                        "errors": [{"message": "injected", "reason": "injected"}],
                    }
                }
                self._answer(int(fault), json.dumps(error).encode(), [("Content-Type", "application/json")])
                return
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                headers["Host"] = up.netloc
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read().replace(proxy.upstream.encode(), proxy.url.encode())
                out = [
                    (k, v.replace(proxy.upstream, proxy.url))
                    for k, v in resp.getheaders()
                    if k.lower() not in HOP_BY_HOP
                ]
                self._answer(resp.status, data, out)
            finally:
                conn.close()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

    return Handler


def writes_to(fragment: str = "") -> Callable[[str, str], bool]:
    """Rule matcher: write requests (uploads, deletes) whose target (path, body start) mentions `fragment`."""
    return lambda method, target: method in WRITES and fragment in target


def any_request(method: str, target: str) -> bool:
    return True
