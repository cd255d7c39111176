"""The stand-ins' HTTP plumbing, once: a threaded server on a loopback port and a JSON request handler.

``LoopbackServer`` starts a ``ThreadingHTTPServer`` in a daemon thread (port 0: a free one) with the
stand-in object reachable from the handler as ``self.server.standin``, and stops it again; given an
``ssl.SSLContext`` it serves HTTPS (the handshake runs in each connection's thread).
``LoopbackHandler`` answers in HTTP/1.1 with a Content-Length, keeps quiet in the log, and reads a
request body as JSON (``parse_body`` turns anything else into the stand-in's own error).
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOPBACK = "127.0.0.1"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    standin: Any
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs in the request's own thread: a silent client cannot stall accept().
        if self.tls is not None:
            request = self.tls.wrap_socket(request, server_side=True)
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up or failed the handshake; the stand-in keeps serving


class LoopbackHandler(BaseHTTPRequestHandler):
    """Request handler base: JSON in, JSON (or text) out."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def send_body(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = (
            body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def parse_body(self, not_json: Callable[[bytes, ValueError], Any]) -> Any:
        """The request body as JSON ({} when empty); ``not_json(raw, error)`` decides about anything else."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except json.JSONDecodeError as err:
            return not_json(raw, err)


class LoopbackServer:
    """One stand-in's HTTP server: ``start()`` returns the base URL; ``stop()`` is idempotent."""

    def __init__(
        self,
        handler: type[LoopbackHandler],
        standin: object,
        *,
        host: str = LOOPBACK,
        port: int = 0,
        name: str = "standin-http",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.handler, self.standin, self.host, self.name, self.tls = handler, standin, host, name, tls
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> str:
        if self._server is None:
            server = _Server((self.host, self._port), self.handler)
            server.standin = self.standin
            server.tls = self.tls
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.1}, name=self.name, daemon=True
            )
            self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the stand-in is not running")
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the stand-in is not running")
        scheme = "https" if self.tls is not None else "http"
        host, port = self._server.server_address[:2]
        if isinstance(host, (bytes, bytearray)):  # typeshed allows bytes; getsockname() gives an AF_INET host as str
            host = host.decode()
        return f"{scheme}://{host}:{port}"
