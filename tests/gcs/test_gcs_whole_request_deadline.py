"""A storage server that answers a byte at a time never holds an Airflow-side storage call past its wall-clock
deadline (TPUFLOW_GCS_REQUEST_TIMEOUT_S bounds the whole request, not the gap between two bytes): the read, the
write and a slice-lease read fail while the server still had most of its answer to send, and the next request to a
healthy server works."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

DEADLINE_S = 1.0
BYTE_EVERY_S = 0.5  # well inside the per-read timeout (the deadline): only a wall-clock deadline ends the request
ANSWER = b'{"holder": "dag/run", "acquired_at": 1.0, "name": "report.json", "bucket": "b", "pad": "' + b"x" * 24 + b'"}'


@dataclass
class TricklingServer:
    """Answers every request 200 with ANSWER (a JSON object), one byte every BYTE_EVERY_S: the status line and
    headers too when ``head`` is set, else at once. Counts the answers it finished sending."""

    head: bool = False
    finished: int = 0
    started: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)

    def start(self) -> TricklingServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.started += 1
                head = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
                )
                try:
                    if not server.head:
                        self.wfile.write(head)
                        self.wfile.flush()
                    for byte in (head if server.head else b"") + ANSWER:
                        if server.stopping.wait(BYTE_EVERY_S):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                except OSError:  # the client shut the connection: it gave up on the answer
                    return
                server.finished += 1

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUFLOW_GCS_REQUEST_TIMEOUT_S", str(DEADLINE_S))


@pytest.fixture
def trickling(emulator_at: Any) -> Iterator[Any]:
    servers: list[TricklingServer] = []

    def start(head: bool = False) -> TricklingServer:
        server = TricklingServer(head=head).start()
        servers.append(server)
        emulator_at(server.url)
        return server

    yield start
    for server in servers:
        server.stop()


def _fails_mid_answer(server: TricklingServer, call: Any, error: type[BaseException], *said: str) -> None:
    """``call`` raises ``error`` (naming ``said``) while the server was still sending the answer it started."""
    with pytest.raises(error) as caught:
        call()
    assert server.started >= 1, "the request reached the server"
    assert server.finished == 0, "the call waited for the whole trickled answer: no deadline on the request"
    for words in said:
        assert words in str(caught.value), str(caught.value)


def test_a_read_from_a_trickling_server_fails_at_its_deadline(bucket: str, trickling: Any) -> None:
    from tpuflow.storage import StorageTimeout, read_text

    server = trickling()
    uri = f"gs://{bucket}/run/report.json"
    said = (f"reading {uri}", f"sent no complete answer within {DEADLINE_S:g} s (TPUFLOW_GCS_REQUEST_TIMEOUT_S)")
    _fails_mid_answer(server, lambda: read_text(uri), StorageTimeout, *said)


def test_a_write_whose_answer_trickles_from_its_first_byte_fails_at_its_deadline(bucket: str, trickling: Any) -> None:
    """The status line itself comes a byte at a time: the wait for the answer's head is the same request."""
    from tpuflow.storage import StorageTimeout, write_text

    server = trickling(head=True)
    uri = f"gs://{bucket}/run/ledger.json"
    _fails_mid_answer(server, lambda: write_text(uri, "{}"), StorageTimeout, f"writing {uri}")


def test_a_slice_lease_read_from_a_trickling_server_fails_at_its_deadline(
    bucket: str, trickling: Any, gcs_emulator: Any, emulator_at: Any
) -> None:
    """The acquire task, its waiting trigger and the reaper read leases with the same client: a trickling server
    does not hold them either; the same client reaches a healthy server again at once."""
    from tpuflow.request_deadline import RequestDeadlineExceeded
    from tpuflow.slices.leases import lease_store

    server = trickling()
    store = lease_store(f"gs://{bucket}/leases")
    _fails_mid_answer(server, lambda: store.holders(1), RequestDeadlineExceeded, "did not finish answering within 1 s")
    emulator_at(gcs_emulator.url)
    assert store.try_acquire("dag/run", 1) is not None and store.holders(1)[0].holder == "dag/run"


def test_a_request_answered_in_time_is_untouched_after_its_deadline(bucket: str) -> None:
    """A kept-alive connection a finished request gave back is never shut by that request's deadline."""
    from tpuflow.storage import gcs_client, read_text, write_text

    client = gcs_client()
    uri = f"gs://{bucket}/run/a.json"
    write_text(uri, '{"a": 1}')
    assert read_text(uri) == '{"a": 1}'
    blob = client.bucket(bucket).blob("run/a.json")
    assert blob.download_as_text() == '{"a": 1}'
    time.sleep(DEADLINE_S + 0.3)  # every deadline armed so far has passed
    assert blob.download_as_text() == '{"a": 1}' and read_text(uri) == '{"a": 1}'
