"""A GCE metadata-server stand-in beside the GCS emulator, so that plain storage code works on the rehearsal.

Google's client libraries look for credentials before they send a request, even to an emulator: pyarrow's
GcsFileSystem (google-cloud-cpp) ends its search at the GCE metadata server and waits for it forever; gcsfs
and google-auth ask it too. This server answers what they ask on a real VM, with a rehearsal token the
emulator never checks: the metadata root and its ping, the default service account (token, email, scopes),
the project, the zone, the universe domain and the maintenance event. Like GCE it answers only requests that
carry ``Metadata-Flavor: Google`` (403 otherwise).

    python -m tpuflow_rehearsal.metadata_server --port P     # what tpuflow_rehearsal.gcs_emulator starts beside fake-gcs-server

Clients find it through GCE_METADATA_HOST / GCE_METADATA_IP (google-auth) and GCE_METADATA_ROOT (google-cloud-cpp
in pyarrow): tpuflow.storage.emulator_env gives them. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

ROOT = "/computeMetadata/v1/"
FLAVOR = "Google"
TOKEN = "tpuflow-rehearsal-token"  # what the emulator is sent; it checks none
TOKEN_LIFETIME_S = 3599
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
DEFAULT_PROJECT = "tpuflow-local"  # tpuflow_rehearsal.gcs_emulator.LOCAL_PROJECT
DEFAULT_NUMERIC_PROJECT = "100000000000"
DEFAULT_ZONE = "us-central1-a"


@dataclass(frozen=True)
class Identity:
    """What the server says about the played VM."""

    project: str = DEFAULT_PROJECT
    numeric_project: str = DEFAULT_NUMERIC_PROJECT
    zone: str = DEFAULT_ZONE

    @property
    def email(self) -> str:
        return f"rehearsal@{self.project}.iam.gserviceaccount.com"


def _account(identity: Identity) -> dict[str, Any]:
    return {"aliases": ["default"], "email": identity.email, "scopes": list(SCOPES)}


def _token(_identity: Identity) -> dict[str, Any]:
    return {"access_token": TOKEN, "expires_in": TOKEN_LIFETIME_S, "token_type": "Bearer"}


# path under ROOT (under the account, for _ACCOUNT_PATHS) -> the answer; a dict is JSON, a str is text.
# No instance/preempted: tpuflow.ray.drain's preStop check reads a 404 as "the VM is going" and drains, as it
# did on the rehearsal before this server existed.
_ACCOUNT_PATHS: dict[str, Callable[[Identity], Any]] = {
    "": lambda i: "aliases\nemail\nscopes\ntoken\n",
    "token": _token,
    "email": lambda i: i.email,
    "scopes": lambda i: "\n".join(SCOPES) + "\n",
}
_PATHS: dict[str, Callable[[Identity], Any]] = {
    "": lambda i: "instance/\nproject/\nuniverse/\n",
    "project/project-id": lambda i: i.project,
    "project/numeric-project-id": lambda i: i.numeric_project,
    "instance/zone": lambda i: f"projects/{i.numeric_project}/zones/{i.zone}",
    "instance/maintenance-event": lambda i: "NONE",
    "instance/service-accounts/": lambda i: f"default/\n{i.email}/\n",
    "universe/universe-domain": lambda i: "googleapis.com",
}


def answer(path: str, identity: Identity) -> Any:
    """The answer for a request path (with its query), or None for a path the server does not know."""
    parsed = urllib.parse.urlsplit(path)
    if parsed.path == "/":
        return ""  # google-auth's ping: only the status and the Metadata-Flavor header count
    if not parsed.path.startswith(ROOT):
        return None
    rest = parsed.path[len(ROOT) :]
    prefix = "instance/service-accounts/"
    if rest.startswith(prefix) and rest != prefix:
        account, _, leaf = rest[len(prefix) :].partition("/")
        if account not in ("default", identity.email) or leaf.rstrip("/") not in _ACCOUNT_PATHS:
            return None
        recursive = "recursive=true" in parsed.query.lower() and not leaf
        return _account(identity) if recursive else _ACCOUNT_PATHS[leaf.rstrip("/")](identity)
    found = _PATHS.get(rest)
    return None if found is None else found(identity)


class MetadataHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: MetadataHttpServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's naming
        if self.headers.get("Metadata-Flavor") != FLAVOR:
            self._send(403, "Missing required header: Metadata-Flavor: Google\n")
            return
        body = answer(self.path, self.server.identity)
        if body is None:
            self._send(404, "Not Found\n")
        else:
            self._send(200, body)

    def _send(self, code: int, body: Any) -> None:
        is_json = isinstance(body, dict)
        data = (json.dumps(body) if is_json else str(body)).encode()
        self.send_response(code)
        self.send_header("Metadata-Flavor", FLAVOR)
        self.send_header("Content-Type", "application/json" if is_json else "application/text")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class MetadataHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], identity: Identity) -> None:
        super().__init__(address, MetadataHandler)
        self.identity = identity

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, (bytes, bytearray)):  # typeshed allows bytes; getsockname() gives an AF_INET host as str
            host = host.decode()
        return f"{host}:{port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up; keep serving

    def start_in_thread(self) -> MetadataHttpServer:
        threading.Thread(target=self.serve_forever, name="gce-metadata", daemon=True).start()
        return self


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise ValueError(value)
    return port


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM / SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m tpuflow_rehearsal.metadata_server", description="A GCE metadata-server stand-in on loopback."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_port, required=True, help="0-65535; 0: a free one (printed)")
    parser.add_argument("--project", default=DEFAULT_PROJECT)
    parser.add_argument("--zone", default=DEFAULT_ZONE)
    args = parser.parse_args(argv)
    try:
        server = MetadataHttpServer((args.host, args.port), Identity(project=args.project, zone=args.zone))
    except OSError as err:
        parser.exit(1, f"{parser.prog}: cannot listen on {args.host}:{args.port}: {err.strerror}\n")

    def stop(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown).start()  # shutdown() waits for serve_forever: not in this thread

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"GCE metadata stand-in at http://{server.address}", flush=True)
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
