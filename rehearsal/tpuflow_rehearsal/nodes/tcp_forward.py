"""A TCP forwarder: one listening address, each connection spliced to a target chosen when it arrives.

What kube-proxy's userspace mode was (a Service address forwarded to one of its ready endpoints) and what the
pod network uses to reach host services. One thread accepts; each connection gets a thread that copies both
ways with ``select``. Written by hand: the standard library has no forwarder, and this is 80 lines.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable

Target = Callable[[], "tuple[str, int] | None"]
_CHUNK = 65536


def listen(address: tuple[str, int]) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(address)
        server.listen(128)
    except OSError:
        server.close()
        raise
    return server


class TcpForwarder:
    def __init__(self, listen: tuple[str, int], target: Target) -> None:
        self.listen, self.target = listen, target
        self._server: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, listening: socket.socket | None = None) -> TcpForwarder:
        """Listen on ``self.listen``; ``listening``: a socket already bound there and listening (one made in a
        pod's network namespace)."""
        server = listening or listen(self.listen)
        server.settimeout(0.5)
        self._server = server
        self._thread = threading.Thread(
            target=self._accept, name=f"forward-{self.listen[0]}:{self.listen[1]}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        target = self.target()
        if target is None:  # no ready endpoint: refuse, as a Service with none does
            client.close()
            return
        try:
            upstream = socket.create_connection(target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        client.settimeout(None)
        pair = {client: upstream, upstream: client}
        try:
            while not self._stopping.is_set():
                readable, _, _ = select.select(list(pair), [], [], 0.5)
                for sock in readable:
                    data = sock.recv(_CHUNK)
                    if not data:
                        return
                    pair[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.close()
