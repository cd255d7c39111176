"""Liveness survives executors and containers: a run's lease and local cluster name the process that supervises
the run, as that process named itself, so the task processes an executor forks (`airflow dags test
--use-executor`) do not name themselves and die with their task; a record written in another pid namespace (a
container sharing this hostname, or another machine with the same name) is never judged by this namespace's pids.
Each time the attack is a waiting run or `tpuflow reap` taking a live run's slice and cluster while it trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.airflow_context import task_context
from support.local_clusters import supervised_cluster
from support.processes import dead_process_record

from tpuflow import liveness
from tpuflow.slices.leases import LocalLeaseStore

# `airflow dags test --use-executor`'s process tree: the dags-test process parses the DAG (importing tpuflow) or
# not, its executor forks a worker that retitles itself, the worker forks the task process, which takes the lease
# and ends with its task; the dags-test process lives on, supervising the run, until its stdin closes.
DAGS_TEST = textwrap.dedent(
    """
    import os, sys
    from setproctitle import setproctitle
    if sys.argv[-1] == "parsed":
        import tpuflow.slices.operators  # the DAG file's imports, parsed before the executor starts
    worker = os.fork()
    if worker == 0:
        setproctitle("airflow worker -- LocalExecutor: <idle>")
        task = os.fork()
        if task == 0:
            from tpuflow.slices.leases import LocalLeaseStore
            LocalLeaseStore(os.environ["LEASES"]).try_acquire("dag/live", 1)
            os._exit(0)
        os._exit(os.waitpid(task, 0)[1])
    assert os.waitpid(worker, 0)[1] == 0
    print("ready", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(liveness.SUPERVISOR_ENV, raising=False)


@pytest.fixture
def heads() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for head in started:
        if head.poll() is None:
            os.killpg(head.pid, 9)
            head.wait()


def _reap(base: Path, leases: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from tpuflow.cli import main

    capsys.readouterr()  # what came before: not the reaper's
    code = main(["reap", "--without-db", "--base-dir", str(base), "--lease-root", str(leases)])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def _waiter_defers(leases: Path) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from tpuflow.slices.operators import TPUAcquireSliceOperator

    acquire = TPUAcquireSliceOperator(task_id="acquire_slice", lease_root=str(leases), max_slices="1")
    with pytest.raises(TaskDeferred):
        acquire.execute(task_context(dag_id="dag", run_id="next"))


@pytest.mark.parametrize("parse", ["parsed", "not-parsed"])
def test_a_lease_taken_in_an_executor_forked_task_process_stays_with_the_live_dags_test(
    parse: str, tmp_path: Path, heads: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The task process that took the lease has exited; the `dags test` process that runs the run has not: neither a
    waiting run nor the reaper takes the lease or the run's cluster. Once that process is gone, both are taken."""
    script = tmp_path / "bin" / "airflow"
    script.parent.mkdir()
    script.write_text(DAGS_TEST)
    leases, base = tmp_path / "leases", tmp_path / "clusters"
    env = {k: v for k, v in os.environ.items() if k != liveness.SUPERVISOR_ENV} | {"LEASES": str(leases)}
    dags_test = subprocess.Popen(
        [sys.executable, str(script), "dags", "test", "--use-executor", "dag", parse],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert dags_test.stdout is not None and dags_test.stdout.readline().strip() == "ready"
        (lease,) = LocalLeaseStore(leases).all_holders().values()
        assert lease.supervisor is not None and lease.supervisor["pid"] == dags_test.pid, lease.supervisor
        cluster, head = supervised_cluster(
            base, "live", lease.supervisor
        )  # what its start-cluster task records the same way
        heads.append(head)
        _waiter_defers(leases)
        assert "no orphans found" in _reap(base, leases, capsys)
        assert [x.holder for x in LocalLeaseStore(leases).all_holders().values()] == ["dag/live"]
        assert head.poll() is None and Path(cluster.state_dir, "state.json").exists()
    finally:
        dags_test.communicate(timeout=30)
    out = _reap(base, leases, capsys)
    assert f"deleted local_cluster {cluster.name}" in out and f"pid {dags_test.pid} exited" in out, out
    assert LocalLeaseStore(leases).all_holders() == {}


def _namespace() -> int:
    """This process's pid namespace (the inode of /proc/self/ns/pid)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pytest.skip("no readable pid namespace here")


def _hold(leases: Path, holder: str, record: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setenv(liveness.SUPERVISOR_ENV, json.dumps(record))
        assert LocalLeaseStore(leases).try_acquire(holder, 1) is not None


@pytest.mark.parametrize(
    "case",
    ["pid absent here", "pid reused here"],
)
def test_a_live_run_in_another_pid_namespace_keeps_its_lease_and_cluster(
    case: str, tmp_path: Path, heads: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A container with this hostname (same kernel, same boot) runs `airflow dags test`: its pid numbers are its
    namespace's. Here that pid is free, or names another process (started at another time): neither proves its
    supervisor dead, so neither the waiter nor the reaper takes its lease or its cluster."""
    here = _namespace()
    me = liveness.process_record()
    ours = dead_process_record() if case == "pid absent here" else {**me, "start": me["start"] - 1}
    assert liveness.dead_reason({**ours, "pid_ns": here}) is not None  # the same record in our namespace: dead
    record = {**ours, "pid_ns": here + 1}  # as the container's process wrote it
    leases, base = tmp_path / "leases", tmp_path / "clusters"
    _hold(leases, "dag/live", record, monkeypatch)
    cluster, head = supervised_cluster(base, "live", record)
    heads.append(head)
    _waiter_defers(leases)
    assert "no orphans found" in _reap(base, leases, capsys)
    assert [x.holder for x in LocalLeaseStore(leases).all_holders().values()] == ["dag/live"]
    assert head.poll() is None and Path(cluster.state_dir, "state.json").exists()


def test_another_machine_sharing_the_hostname_is_not_a_reboot_of_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record from a boot this machine never had (another machine named the same, sharing a lease root) proves
    nothing; one from a boot this machine had (it rebooted since) proves its process gone."""
    from tpuflow.paths import tpuflow_home

    tpuflow_home().mkdir(parents=True, exist_ok=True)  # made by the first lease or cluster
    me = liveness.process_record()  # remembers this boot
    if not me["boot_id"]:
        pytest.skip("no boot id here")
    leases = LocalLeaseStore(tmp_path / "leases")
    _hold(leases.root, "dag/elsewhere", {**me, "boot_id": "0f0f0f0f-another-machines-boot"}, monkeypatch)
    assert leases.take_over_dead(1, "dag/next") == []
    assert leases.release("dag/elsewhere") == [0]

    _hold(leases.root, "dag/before-reboot", me, monkeypatch)
    monkeypatch.setattr(liveness, "boot_id", lambda: "1e1e1e1e-this-machine-after-a-reboot")
    [(lease, why)] = leases.take_over_dead(1, "dag/next")
    assert lease.holder == "dag/before-reboot" and why == f"its supervisor host {me['host']} rebooted"
