"""The preemption-notice bridge of a KubeRay TPU worker pod: its preStop hook asks the GCE metadata server
whether the VM is going (here a loopback stand-in answering as the metadata server does), and drains its
own Ray node with the same `ray drain-node` arguments `tpuflow local preempt --notice` runs."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tpuflow.ray.drain import PREEMPTION_REASON, VM_GOING_SCRIPT, drain_node_args, prestop_hook


@pytest.fixture
def metadata() -> Iterator[dict[str, str]]:
    answers: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            key = self.path.removeprefix("/computeMetadata/v1/instance/")
            if self.headers.get("Metadata-Flavor") != "Google" or key not in answers:
                self.send_response(403 if key in answers else 404)
                self.end_headers()
                return
            body = answers[key].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    answers["host"] = f"127.0.0.1:{server.server_address[1]}"
    try:
        yield answers
    finally:
        server.shutdown()
        server.server_close()


def _vm_going(host: str) -> int:
    env = {"GCE_METADATA_HOST": host, "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", VM_GOING_SCRIPT], env=env, timeout=30).returncode


@pytest.mark.parametrize(
    ("preempted", "maintenance", "going"),
    [
        ("TRUE", "NONE", 0),
        ("FALSE", "TERMINATE_ON_HOST_MAINTENANCE", 0),
        ("FALSE", "NONE", 1),  # the pod is deleted while the VM stays (a torn-down RayCluster): no hold
        ("FALSE", "MIGRATE_ON_HOST_MAINTENANCE", 1),
    ],
)
def test_the_hook_asks_the_metadata_server_whether_the_vm_is_going(metadata, preempted, maintenance, going) -> None:
    metadata.update({"preempted": preempted, "maintenance-event": maintenance})
    assert _vm_going(metadata["host"]) == going


def test_a_metadata_server_that_cannot_say_counts_as_going(metadata) -> None:
    assert _vm_going(metadata["host"]) == 0  # 404: keep the notice rather than lose the work
    assert _vm_going("127.0.0.1:9") == 0  # nothing listens


def test_the_hook_drains_its_own_node_for_preemption_and_holds_for_the_notice() -> None:
    (shell,) = prestop_hook(15)["exec"]["command"][2:]
    check, rest = shell.split(" || exit 0; ")
    drain, hold = rest.split(" || true; ")
    assert check.startswith("python -c ") and hold == "sleep 15"
    assert drain.split()[:4] == ["ray", "drain-node", f"--reason={PREEMPTION_REASON}", "'--reason-message=the"]
    assert "--deadline-remaining-seconds=15" in drain and "--node-id" not in drain  # its own node
    # the same arguments as the local cluster's notice, which names the node and the cluster
    local = drain_node_args(20, "m", node_id="ab12", address="127.0.0.1:6379")
    assert local == [
        "drain-node",
        f"--reason={PREEMPTION_REASON}",
        "--reason-message=m",
        "--deadline-remaining-seconds=20",
        "--node-id=ab12",
        "--address=127.0.0.1:6379",
    ]
