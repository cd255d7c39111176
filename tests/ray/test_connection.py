"""The hook's cluster is the one its clients talk to, whatever the worker's environment says."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.json_http import answer_json

from tpuflow.rayjob.hooks import RayJobHook


class _Dashboard(BaseHTTPRequestHandler):
    """Just enough of a Ray dashboard for JobSubmissionClient's version check and job list."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        answer_json(
            self, {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"} if self.path == "/api/version" else []
        )

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("variable", ["RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"])
def test_a_shells_ray_address_never_redirects_the_runs_jobs(
    dashboard: str, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's JobSubmissionClient lets these variables override the address it is given; a worker started
    from a shell that ran `eval "$(tpuflow local env)"` for another cluster kept them (seen in `make demo`)."""
    monkeypatch.setenv(variable, "http://127.0.0.1:9")  # nothing listens on the discard port
    hook = RayJobHook(cluster={"dashboard_url": dashboard})
    assert hook.find_jobs("tpuflow-x") == []
    assert hook.get_client()._address == dashboard
    assert os.environ[variable] == "http://127.0.0.1:9"  # the worker's environment is left as it was
