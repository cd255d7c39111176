"""The GCE metadata stand-in (tpuflow_rehearsal.metadata_server): what Google's client libraries ask a metadata server
for, answered only with `Metadata-Flavor: Google` as on GCE; started beside the GCS emulator and stopped with it,
by pid, never a process that is not the one it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from support.processes import cmdline, sleeper, survives

from tpuflow.storage import EMULATOR_ENV, METADATA_ENV
from tpuflow_rehearsal.gcs_emulator import METADATA_MODULE, STATE_FILE, GcsEmulator, GcsEmulatorError, emulator_for
from tpuflow_rehearsal.metadata_server import TOKEN, Identity, MetadataHttpServer

V1 = "/computeMetadata/v1"
IDENTITY = Identity(project="proj-x", numeric_project="4242", zone="us-east5-b")
EMAIL = "rehearsal@proj-x.iam.gserviceaccount.com"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    http = MetadataHttpServer(("127.0.0.1", 0), IDENTITY).start_in_thread()
    try:
        yield http.address
    finally:
        http.shutdown()
        http.server_close()


def get(address: str, path: str, flavor: str | None = "Google") -> tuple[int, dict[str, str], str]:
    headers = {"Metadata-Flavor": flavor} if flavor else {}
    request = urllib.request.Request(f"http://{address}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


ANSWERS = {
    "/": "",
    f"{V1}/": "instance/\nproject/\nuniverse/\n",
    f"{V1}/project/project-id": "proj-x",
    f"{V1}/project/numeric-project-id": "4242",
    f"{V1}/instance/zone": "projects/4242/zones/us-east5-b",
    f"{V1}/instance/maintenance-event": "NONE",
    f"{V1}/instance/service-accounts/": f"default/\n{EMAIL}/\n",
    f"{V1}/instance/service-accounts/default/": "aliases\nemail\nscopes\ntoken\n",
    f"{V1}/instance/service-accounts/default/email": EMAIL,
    f"{V1}/instance/service-accounts/default/scopes": "https://www.googleapis.com/auth/cloud-platform\n",
    f"{V1}/universe/universe-domain": "googleapis.com",
}
TOKEN_PATHS = [
    f"{V1}/instance/service-accounts/default/token",
    f"{V1}/instance/service-accounts/default/token?scopes=https://www.googleapis.com/auth/devstorage.read_write",
    f"{V1}/instance/service-accounts/{EMAIL}/token",
]


@pytest.mark.parametrize("path", sorted(ANSWERS))
def test_answers_what_the_client_libraries_ask(server: str, path: str) -> None:
    status, headers, body = get(server, path)
    assert (status, body) == (200, ANSWERS[path])
    assert headers["Metadata-Flavor"] == "Google"  # google-auth's ping checks it


@pytest.mark.parametrize("path", TOKEN_PATHS)
def test_the_default_account_has_a_rehearsal_token(server: str, path: str) -> None:
    status, headers, body = get(server, path)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}


def test_the_account_recursively_is_json(server: str) -> None:
    status, _, body = get(server, f"{V1}/instance/service-accounts/default/?recursive=true")
    assert status == 200
    assert json.loads(body) == {
        "aliases": ["default"],
        "email": EMAIL,
        "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
    }


@pytest.mark.parametrize("path", [*sorted(ANSWERS), *TOKEN_PATHS])
@pytest.mark.parametrize("flavor", [None, "google", "Other"], ids=["no header", "wrong case", "wrong value"])
def test_a_request_without_the_metadata_flavor_header_is_refused(server: str, path: str, flavor: str | None) -> None:
    status, _, body = get(server, path, flavor)
    assert status == 403 and "Metadata-Flavor" in body and TOKEN not in body


@pytest.mark.parametrize(
    "path",
    [
        f"{V1}/instance/attributes/accelerator-type",
        f"{V1}/instance/service-accounts/someone-else@p.iam.gserviceaccount.com/token",
        f"{V1}/instance/service-accounts/default/identity",
        "/computeMetadata/v2/project/project-id",
    ],
)
def test_what_it_does_not_know_is_404(server: str, path: str) -> None:
    assert get(server, path)[0] == 404


@pytest.mark.parametrize("port", ["70000", "http"])
def test_a_bad_port_is_one_line_not_a_traceback(port: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", METADATA_MODULE, "--port", port], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "--port" in done.stderr and "Traceback" not in done.stderr


def test_a_port_in_use_is_one_line_not_a_traceback(server: str) -> None:
    port = server.rsplit(":", 1)[1]
    done = subprocess.run(
        [sys.executable, "-m", METADATA_MODULE, "--port", port], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


# --- started and stopped with the GCS emulator ------------------------------------------------------------


def _metadata_children() -> set[int]:
    """Live metadata stand-ins this process started (its children running tpuflow_rehearsal.metadata_server)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if stat[0] != "Z" and int(stat[1]) == os.getpid() and METADATA_MODULE.encode() in argv:
            found.add(int(proc.name))
    return found


def test_starts_and_stops_by_pid_with_the_emulator(tmp_path: Path) -> None:
    emulator = GcsEmulator.start(state_dir=tmp_path)
    try:
        recorded = json.loads((tmp_path / STATE_FILE).read_text())
        assert (recorded["metadata_pid"], recorded["metadata_port"]) == (emulator.metadata_pid, emulator.metadata_port)
        assert emulator.metadata_is_alive() and emulator.metadata_pid in _metadata_children()
        assert emulator.env() == {EMULATOR_ENV: emulator.url, METADATA_ENV: f"127.0.0.1:{emulator.metadata_port}"}
        status, _, body = get(emulator.env()[METADATA_ENV], f"{V1}/project/project-id")
        assert (status, body) == (200, "tpuflow-local")
    finally:
        loaded = GcsEmulator.load(tmp_path)
        assert loaded == emulator and loaded.stop()
    assert not emulator.metadata_is_alive() and emulator.metadata_pid not in _metadata_children()
    assert not emulator.is_alive() and not (tmp_path / STATE_FILE).exists()


def test_stop_leaves_a_recorded_pid_that_is_not_the_stand_in(tmp_path: Path, procs: list[subprocess.Popen]) -> None:
    emulator = GcsEmulator.start(state_dir=tmp_path)
    real = emulator.metadata_pid
    other = sleeper(procs, METADATA_MODULE, "--port", "1")  # right module, another port: not ours
    try:
        emulator.metadata_pid = other.pid
        assert not emulator.metadata_is_alive()
        assert emulator.stop() is True
        assert survives(other)
    finally:
        emulator.metadata_pid = real
        emulator.stop()
    assert real not in _metadata_children()


def test_a_failed_start_leaves_neither_process(tmp_path: Path) -> None:
    before = _metadata_children()
    with pytest.raises(Exception, match="invalid bucket name"):  # the emulator's 400, after both started
        GcsEmulator.start(buckets=["x"], state_dir=tmp_path)
    assert _metadata_children() == before
    data = str((tmp_path / "data").resolve())
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and data in cmdline(int(p.name))]
    assert not (tmp_path / STATE_FILE).exists()
    assert GcsEmulator.load(tmp_path) is None


def test_a_start_with_an_emulator_running_names_it(tmp_path: Path) -> None:
    emulator = GcsEmulator.start(state_dir=tmp_path)
    try:
        with pytest.raises(GcsEmulatorError, match=f"already runs at {emulator.url}"):
            GcsEmulator.start(state_dir=tmp_path)
        assert emulator.metadata_is_alive()
    finally:
        emulator.stop()


def test_emulator_for_starts_both_exports_them_and_stops_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMULATOR_ENV, raising=False)
    monkeypatch.delenv(METADATA_ENV, raising=False)
    before = _metadata_children()
    with emulator_for(["tpuflow-for-bucket"]) as url:
        address = os.environ[METADATA_ENV]
        assert os.environ[EMULATOR_ENV] == url
        assert get(address, f"{V1}/instance/service-accounts/default/email")[0] == 200
        assert len(_metadata_children() - before) == 1
    assert EMULATOR_ENV not in os.environ and METADATA_ENV not in os.environ
    assert _metadata_children() == before


def test_emulator_for_reuses_a_running_emulator_and_its_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator = GcsEmulator.start(state_dir=tmp_path)
    try:
        for key, value in emulator.env().items():
            monkeypatch.setenv(key, value)
        before = _metadata_children()
        with emulator_for(["tpuflow-reused"]) as url:
            assert url == emulator.url and os.environ[METADATA_ENV] == emulator.metadata_address
            assert _metadata_children() == before  # nothing new started
        assert os.environ[METADATA_ENV] == emulator.metadata_address and emulator.metadata_is_alive()
    finally:
        emulator.stop()


def test_emulator_for_gives_an_emulator_without_a_stand_in_one_for_the_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator = GcsEmulator.start(state_dir=tmp_path)
    try:
        monkeypatch.setenv(EMULATOR_ENV, emulator.url)  # e.g. exported by hand, before the stand-in existed
        monkeypatch.delenv(METADATA_ENV, raising=False)
        before = _metadata_children()
        with emulator_for(["tpuflow-given"]):
            address = os.environ[METADATA_ENV]
            assert address != emulator.metadata_address
            assert get(address, f"{V1}/project/project-id")[0] == 200
        assert METADATA_ENV not in os.environ and _metadata_children() == before
    finally:
        emulator.stop()


def test_an_old_state_file_without_a_stand_in_still_loads_and_stops(tmp_path: Path) -> None:
    emulator = GcsEmulator.start(state_dir=tmp_path)
    metadata = (emulator.metadata_pid, emulator.metadata_port)
    old = {k: v for k, v in asdict(emulator).items() if not k.startswith("metadata_")}
    (tmp_path / STATE_FILE).write_text(json.dumps(old))
    loaded = GcsEmulator.load(tmp_path)
    other_child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    while not Path(f"/proc/{other_child.pid}/stat").read_text().rsplit(")", 1)[1].startswith(" Z"):
        pass  # exited, not yet waited for: what a stray waitpid would take
    try:
        assert loaded is not None and loaded.metadata_address is None
        assert loaded.env() == {EMULATOR_ENV: emulator.url}
        assert loaded.stop()
        assert other_child.wait(timeout=10) == 3  # no stand-in recorded: no other child of ours reaped
    finally:
        emulator.stop()
    assert metadata[0] not in _metadata_children()
