"""A Service address forwards to its ready endpoints, as kube-proxy makes it (the TCP path, on loopback)."""

from __future__ import annotations

import socket
import threading

from tpuflow_rehearsal.nodes.service_proxy import ServiceProxy
from tpuflow_rehearsal.nodes.tcp_forward import TcpForwarder


def test_endpoint_slices_name_the_ready_targets_per_port() -> None:
    proxy = ServiceProxy("unused")
    proxy._endpoints = {}
    slices = [
        {
            "metadata": {"namespace": "default", "labels": {"kubernetes.io/service-name": "svc"}},
            "endpoints": [
                {"addresses": ["10.200.0.5"], "conditions": {"ready": True}},
                {"addresses": ["10.200.0.6"], "conditions": {"ready": False}},
            ],
            "ports": [{"name": "serve", "port": 8000}],
        }
    ]
    proxy.sync([], slices)  # no Services with addresses: nothing is bound, the endpoints are known
    assert proxy._picker("default/svc", "serve")() == ("10.200.0.5", 8000)
    assert proxy._picker("default/svc", "dashboard")() is None


def test_the_forwarder_splices_both_ways_and_refuses_without_a_target() -> None:
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen(1)

    def echo() -> None:
        conn, _ = upstream.accept()
        with conn:
            conn.sendall(conn.recv(100).upper())

    threading.Thread(target=echo, daemon=True).start()
    target: list[tuple[str, int] | None] = [upstream.getsockname()]
    forwarder = TcpForwarder(("127.0.0.1", 0), lambda: target[0])
    forwarder.start()
    try:
        address = forwarder._server.getsockname()  # type: ignore[union-attr]
        with socket.create_connection(address, timeout=5) as client:
            client.sendall(b"hello")
            assert client.recv(100) == b"HELLO"
        target[0] = None
        with socket.create_connection(address, timeout=5) as client:
            assert client.recv(100) == b""  # closed: no endpoint
    finally:
        forwarder.stop()
        upstream.close()
