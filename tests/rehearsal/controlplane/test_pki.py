"""The control plane's keys: a CA whose serving certificates a client verifies, and the static token file."""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tpuflow_rehearsal.controlplane.pki import CertificateAuthority, load_ca, new_client, write_pki


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def test_a_serving_certificate_verifies_for_its_hosts_only(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    ca = CertificateAuthority.generate()
    cert, key = ca.serving_pair("api", ["127.0.0.1", "kubernetes.default.svc"])
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    server = HTTPServer(("127.0.0.1", 0), _Ok)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        trusted = ssl.create_default_context(cadata=ca.cert_pem.decode())
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/", context=trusted, timeout=5) as resp:
            assert resp.status == 200
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"https://localhost:{port}/", context=trusted, timeout=5)
        stranger = ssl.create_default_context(cadata=CertificateAuthority.generate().cert_pem.decode())
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"https://127.0.0.1:{port}/", context=stranger, timeout=5)
    finally:
        server.shutdown()


def test_written_files_are_private_and_the_token_file_names_each_client(tmp_path: Path) -> None:
    clients = [new_client("admin"), new_client("system:node:agent", "system:nodes")]
    paths = write_pki(tmp_path, clients, api_hosts=["127.0.0.1"])
    for name in ("ca_key", "apiserver_key", "sa_key", "tokens"):
        assert paths[name].stat().st_mode & 0o077 == 0, name
    lines = paths["tokens"].read_text().splitlines()
    assert lines[0] == f"{clients[0].token},admin,admin"
    assert lines[1] == f'{clients[1].token},system:node:agent,system:node:agent,"system:nodes"'
    assert clients[0].token != clients[1].token and len(clients[0].token) >= 32
    assert load_ca(tmp_path).cert_pem == paths["ca_cert"].read_bytes()
