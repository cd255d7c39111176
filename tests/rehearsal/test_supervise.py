"""tpuflow_rehearsal.supervise: a signal to `tpuflow demo` reaches the child's whole process group, the teardowns run
and the command exits 130/143 naming what it cleaned; a second signal kills at once; a SIGKILLed supervisor
takes its children with it; while the run waits for a lease, the demo says who holds it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tpuflow import liveness
from tpuflow.slices.leases import LocalLeaseStore
from tpuflow_rehearsal.supervise import (
    LeaseWaitReporter,
    Supervisor,
    release_supervised_leases,
    stop_supervised_clusters,
)


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if liveness.start_time(pid) is None:
            return True
        time.sleep(0.05)
    return False


def _signal_me(sig: int, after: float) -> None:
    threading.Timer(after, os.kill, args=(os.getpid(), sig)).start()


def _wait_for(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_sigterm_is_forwarded_to_the_child_group_then_teardowns_run_and_the_exit_is_143(tmp_path: Path) -> None:
    said: list[str] = []
    torn: list[str] = []
    grandchild = tmp_path / "grandchild.pid"
    script = f"trap 'echo TERM > {tmp_path}/term; exit 0' TERM; sleep 60 & echo $! > {grandchild}; wait"
    with pytest.raises(SystemExit) as exited:
        with Supervisor("tpuflow demo", say=said.append, grace=20) as sup:
            sup.add_teardown(lambda: torn.append("leases") or ["released slice lease(s) [0] of dag/run"])
            sup.add_teardown(lambda: torn.append("clusters") or ["stopped local Ray cluster local-x"])
            proc = sup.popen(["bash", "-c", script])
            _wait_for(grandchild)
            _signal_me(signal.SIGTERM, 0.1)
            proc.wait()
            sup.check()
            raise AssertionError("not interrupted")
    assert exited.value.code == 143
    assert (tmp_path / "term").read_text().strip() == "TERM"  # the child got it
    assert _gone(int(grandchild.read_text()))  # and its whole group
    assert torn == ["clusters", "leases"]  # last added first
    assert said == [
        "tpuflow demo: interrupted by SIGTERM: stopped local Ray cluster local-x; released slice lease(s) [0] of dag/run"
    ]
    assert signal.getsignal(signal.SIGTERM) is not sup._handle  # handlers restored


def test_a_second_sigint_kills_the_child_group_at_once(tmp_path: Path) -> None:
    said: list[str] = []
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        with Supervisor("tpuflow demo", say=said.append, grace=60) as sup:
            _signal_me(signal.SIGINT, 0.5)
            _signal_me(signal.SIGINT, 1.0)
            # ignores SIGINT and SIGTERM: only the second signal's SIGKILL ends it
            sup.run(["bash", "-c", f"trap '' INT TERM; echo $$ > {pid_file}; while :; do sleep 0.1; done"])
    assert exited.value.code == 130
    assert time.monotonic() - started < 15
    assert _gone(int(pid_file.read_text()))
    assert said == ["tpuflow demo: interrupted by SIGINT: nothing was left to clean"]


def test_no_signal_no_teardown(tmp_path: Path) -> None:
    torn: list[str] = []
    with Supervisor("tpuflow demo", say=torn.append) as sup:
        sup.add_teardown(lambda: torn.append("ran") or [])
        assert sup.run(["true"]) == 0
    assert torn == []


def test_a_sigkilled_supervisor_takes_its_child_with_it(tmp_path: Path) -> None:
    code = (
        "import sys, time; from tpuflow_rehearsal.supervise import Supervisor\n"
        "with Supervisor('x') as sup:\n"
        "    print(sup.popen(['sleep', '60']).pid, flush=True); time.sleep(60)\n"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(supervisor.stdout.readline())  # type: ignore[union-attr]
        assert liveness.start_time(child) is not None
        supervisor.kill()
        supervisor.wait()
        assert _gone(child), "the child outlived its SIGKILLed supervisor"
    finally:
        if supervisor.poll() is None:
            supervisor.kill()


def test_a_child_spawned_from_a_thread_outlives_the_thread_and_dies_with_the_process() -> None:
    """PR_SET_PDEATHSIG follows the forking *thread*: a component restarted by a fault injector's thread lived only
    as long as that thread (kube-apiserver was gone the moment the restart returned). spawn forks from one thread
    that lives as long as the process."""
    code = (
        "import subprocess, threading, time; from tpuflow_rehearsal.supervise import spawn\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.append(spawn(['sleep', '60']))); t.start(); t.join()\n"
        "time.sleep(1.0); print(out[0].pid, out[0].poll(), flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid, polled = (parent.stdout.readline() if parent.stdout else "").split()
        assert polled == "None", "the child died with the thread that asked for it"
        parent.kill()
        parent.wait()
        assert _gone(int(pid)), "the child outlived its SIGKILLed parent process"
    finally:
        if parent.poll() is None:
            parent.kill()


def _hold(root: Path, holder: str, record: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setenv(liveness.SUPERVISOR_ENV, json.dumps(record))
        assert LocalLeaseStore(root).try_acquire(holder, 4) is not None


def test_the_demo_says_who_holds_the_lease_it_waits_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = liveness.process_record()
    other = liveness.process_record(os.getppid())
    said: list[str] = []
    reporter = LeaseWaitReporter(me, slots=1, lease_root=str(tmp_path), say=said.append)
    assert reporter.poll() is None  # nothing held
    _hold(tmp_path, "dag/other", other, monkeypatch)
    expected = f"tpuflow demo: waiting for slice lease held by dag/other (pid {other['pid']} on host {other['host']})"
    assert reporter.poll() == expected
    assert reporter.poll() is None  # once per change
    LocalLeaseStore(tmp_path).release("dag/other")
    _hold(tmp_path, "dag/mine", me, monkeypatch)
    _hold(tmp_path, "dag/other", other, monkeypatch)
    assert reporter.poll() is None  # the demo's run holds one: not waiting
    assert said == [expected]


def test_teardowns_release_only_the_supervised_runs_leases_and_clusters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.local.cluster import LocalRayCluster

    me, other = liveness.process_record(), liveness.process_record(os.getppid())
    _hold(tmp_path / "leases", "dag/mine", me, monkeypatch)
    _hold(tmp_path / "leases", "dag/other", other, monkeypatch)
    assert release_supervised_leases(me, str(tmp_path / "leases")) == ["released slice lease(s) [0] of dag/mine"]
    assert [lease.holder for lease in LocalLeaseStore(tmp_path / "leases").all_holders().values()] == ["dag/other"]
    for name, record in (("local-mine", me), ("local-other", other)):
        state = tmp_path / "clusters" / name
        state.mkdir(parents=True)
        cluster = LocalRayCluster(name, str(state), str(tmp_path / f"tmp-{name}"), "", "", 0, None, supervisor=record)
        cluster.save()
    assert stop_supervised_clusters(me, tmp_path / "clusters") == ["stopped local Ray cluster local-mine"]
    assert sorted(p.name for p in (tmp_path / "clusters").iterdir()) == ["local-other"]
