"""Secret files (the Airflow admin's passwords.json, the local Airflow's services.json, a local Ray cluster's
token, the Kubernetes stand-in's kubeconfig) are private from their first byte: created 0600 (never chmod-ed afterwards) in a 0700 folder, even
under umask 0, and an existing file is replaced atomically."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuflow.secret_files import write_secret_file


class Stop(Exception):
    """Ends a start right after its secrets are written (nothing is started)."""


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def no_chmod_after_the_fact(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every chmod of a file: a secret made private after it was written was readable before."""
    chmodded: list[str] = []
    real = os.chmod

    def spy(path: Any, mode: int, *args: Any, **kwargs: Any) -> None:
        if Path(path).is_file():
            chmodded.append(str(path))
        real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "chmod", spy)
    return chmodded


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_private(path: Path) -> None:
    assert mode(path) == 0o600, f"{path}: {oct(mode(path))}"
    assert mode(path.parent) == 0o700, f"{path.parent}: {oct(mode(path.parent))}"


def test_a_secret_file_is_0600_in_a_0700_folder_and_replaced_atomically(
    tmp_path: Path, open_umask: None, no_chmod_after_the_fact: list[str]
) -> None:
    target = tmp_path / "a" / "b" / "token"
    write_secret_file(target, "first")
    assert_private(target)
    assert mode(tmp_path / "a") == 0o700  # created parents are private too
    # an existing file (even one readable by all) is replaced, never written in place
    target.chmod(0o644)
    before = target.stat().st_ino
    no_chmod_after_the_fact.clear()
    write_secret_file(target, b"second")
    assert target.read_text() == "second" and target.stat().st_ino != before
    assert_private(target)
    assert no_chmod_after_the_fact == []
    assert sorted(p.name for p in target.parent.iterdir()) == ["token"]  # no temporary left behind


def test_an_existing_open_folder_is_narrowed(tmp_path: Path, open_umask: None) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o777)
    assert mode(folder) == 0o777
    assert_private(write_secret_file(folder / "token", "t"))


def test_a_link_planted_at_the_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    target = tmp_path / "state" / "token"
    target.parent.mkdir()
    target.symlink_to(victim)
    write_secret_file(target, "secret")
    assert victim.read_text() == "untouched"
    assert not target.is_symlink() and target.read_text() == "secret"


def test_local_cluster_token_is_private_while_the_cluster_starts(
    tmp_path: Path, open_umask: None, no_chmod_after_the_fact: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.local.cluster import TOKEN_FILE, LocalRayCluster

    seen: dict[str, int] = {}

    def start_head(self: LocalRayCluster, *args: Any) -> None:
        token = Path(self.state_dir) / TOKEN_FILE
        seen.update(file=mode(token), folder=mode(token.parent))
        raise Stop

    monkeypatch.setattr(LocalRayCluster, "_start_head", start_head)
    with pytest.raises(Stop):
        LocalRayCluster.start(None, "secret-test", tmp_path / "clusters")
    assert seen == {"file": 0o600, "folder": 0o700}
    assert not any(TOKEN_FILE in p for p in no_chmod_after_the_fact)


def test_airflow_passwords_and_services_state_are_private(
    tmp_path: Path, open_umask: None, no_chmod_after_the_fact: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow_rehearsal.airflow_services import STATE_FILE, AirflowServices

    def stop_before_migrating(self: AirflowServices, *args: str, **kwargs: Any) -> Any:
        raise Stop

    monkeypatch.setattr(AirflowServices, "airflow", stop_before_migrating)
    work = tmp_path / "airflow"
    with pytest.raises(Stop):
        AirflowServices.start(work)
    passwords, state = work / "home" / "passwords.json", work / STATE_FILE
    assert_private(passwords)
    assert_private(state)
    assert "admin" in passwords.read_text() and "password" in state.read_text()
    assert no_chmod_after_the_fact == []


def test_the_standin_kubeconfig_is_never_readable_by_another_user_while_written(
    tmp_path: Path, open_umask: None, no_chmod_after_the_fact: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another local user polling the stand-in's work folder never finds its kubeconfig (which holds the API token)
    with group or other bits: each file opened for writing there is checked the moment it exists."""
    import io

    from tpuflow_rehearsal.standins.kubernetes_api import KubernetesApiStandin

    folder = tmp_path / "kube"
    folder.mkdir()
    modes: list[tuple[str, int]] = []
    real_open, real_io_open = os.open, io.open

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        if Path(path).parent == folder:
            modes.append((Path(path).name, stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    def io_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_io_open(file, mode, *args, **kwargs)
        if isinstance(file, str | Path) and Path(file).parent == folder and set(mode) & set("wax+"):
            modes.append((Path(file).name, stat.S_IMODE(os.fstat(handle.fileno()).st_mode)))
        return handle

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)
    api = KubernetesApiStandin(tls=False)
    with api:
        path = api.write_kubeconfig(folder / "kubeconfig")
    assert modes, "the kubeconfig was written without being opened"
    assert all(bits & 0o077 == 0 for _, bits in modes), f"readable by others while written: {modes}"
    assert mode(path) == 0o600 and str(api.token) in path.read_text()
    assert no_chmod_after_the_fact == []
