"""A loopback HTTP endpoint for testing clients: every POST is recorded and answered by a function of it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# (the request's headers, its body) -> (status, body text) to answer with
Answer = Callable[[Message, bytes], tuple[int, str]]


class LoopbackEndpoint:
    """Answers POSTs on a free port of 127.0.0.1 from a daemon thread while in a ``with`` block.

    ``requests`` holds each request's (headers, body), appended before ``answer`` is asked, so an answer
    may depend on how many came before. ``keep_alive`` answers in HTTP/1.1 (as Serve's proxy does)."""

    def __init__(self, answer: Answer, path: str = "/addition/v1/completions", keep_alive: bool = False) -> None:
        self.requests: list[tuple[Message, bytes]] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                requests.append((self.headers, self.rfile.read(int(self.headers["Content-Length"]))))
                status, text = answer(*requests[-1])
                body = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def __enter__(self) -> LoopbackEndpoint:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
