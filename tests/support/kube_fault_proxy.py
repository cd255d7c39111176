"""A TLS proxy in front of the real kube-apiserver (tpuflow_rehearsal.controlplane) that answers chosen requests with the
errors a loaded or restarting API server gives (429 Too Many Requests with Retry-After, 500, 503) and passes every
other request through unchanged. Only the clients given its kubeconfig go through it (the DAG's Airflow
connection); the KubeRay operator, the node agent and the tests' own checks talk to kube-apiserver directly.

Written here because the real API server has no switch for a chosen error on a chosen request (API Priority and
Fairness answers 429 only under real load) and the fault rows need one, at a known moment, a known number of times.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization"}


@dataclass
class Fault:
    code: int
    method: str
    plural: str
    times: int
    retry_after: int = 0

    def matches(self, method: str, path: str) -> bool:
        segments = urllib.parse.urlsplit(path).path.split("/")
        return self.times > 0 and method == self.method and self.plural in segments


class KubeFaultProxy:
    """``with KubeFaultProxy(plane, workdir) as proxy``: ``proxy.add_fault(429, "POST", "rayclusters", times=2)``,
    ``proxy.kubeconfig`` for the client under test, ``proxy.fired`` for what was answered with an error."""

    def __init__(self, plane: Any, workdir: Path) -> None:
        from tpuflow_rehearsal.controlplane.pki import load_ca

        self.plane = plane
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert, key = load_ca(Path(plane.paths["ca_cert"]).parent).serving_pair("kube-fault-proxy", ["127.0.0.1"])
        (self.workdir / "proxy.crt").write_bytes(cert)
        (self.workdir / "proxy.key").touch(mode=0o600)
        (self.workdir / "proxy.key").write_bytes(key)
        self.faults: list[Fault] = []
        self.fired: list[str] = []
        self._lock = threading.Lock()
        upstream = urllib.parse.urlsplit(plane.url)
        self._upstream = (upstream.hostname or "127.0.0.1", upstream.port or 443)
        self._upstream_tls = ssl.create_default_context(cafile=str(plane.paths["ca_cert"]))
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- faults -------------------------------------------------------------------------------------------------
    def add_fault(self, code: int, method: str, plural: str, *, times: int = 1, retry_after: int = 0) -> None:
        with self._lock:
            self.faults.append(Fault(code, method, plural, times, retry_after))

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    fault.times -= 1
                    self.fired.append(f"{fault.code} on {method} {urllib.parse.urlsplit(path).path}")
                    return fault
        return None

    # --- what the client under test is given ------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None, "start() the proxy first"
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    @property
    def kubeconfig(self) -> Path:
        """The plane's admin kubeconfig with the proxy as its server (same CA: the proxy's certificate is the
        plane's CA's)."""
        import yaml

        config = yaml.safe_load(Path(self.plane.kubeconfig("admin")).read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.url
        path = self.workdir / "kubeconfig"
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path

    def connection_env(self, conn_id: str) -> dict[str, str]:
        value = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(self.kubeconfig), "namespace": "default"}}
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(value)}

    # --- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> KubeFaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                return

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy._take(self.command, self.path)
                if fault is not None:
                    status = {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": f"injected by the fault proxy: {REASONS.get(fault.code, 'Error')}",
                        "reason": REASONS.get(fault.code, "InternalError"),
                        "code": fault.code,
                        **({"details": {"retryAfterSeconds": fault.retry_after}} if fault.code == 429 else {}),
                    }
                    data = json.dumps(status).encode()
                    self.send_response(fault.code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if fault.code == 429:
                        self.send_header("Retry-After", str(fault.retry_after))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                upstream = http.client.HTTPSConnection(*proxy._upstream, context=proxy._upstream_tls, timeout=120)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()  # tpuflow's clients make no watch requests: whole bodies are enough
                    self.send_response(answer.status)
                    for key, value in answer.getheaders():
                        if key.lower() not in HOP_BY_HOP | {"content-length"}:
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    upstream.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(self.workdir / "proxy.crt", self.workdir / "proxy.key")
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="kube-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> KubeFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
