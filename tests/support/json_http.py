"""Answering a test server's request with JSON (http.server handlers)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


def answer_json(handler: BaseHTTPRequestHandler, body: Any, status: int = 200) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
