"""A local cluster signals only processes that provably are its own, without Ray.

state.json records the nodes' pids; after a reboot or a pid wrap such a pid is someone else's (an unrelated
`sleep` was killed by `tpuflow reap`). Here the recorded pids point at processes in their own sessions, as
Ray nodes are: unrelated ones must survive stop(), kill_host() and the reaper, and count as gone; ones that
carry the cluster's variable or name its temp dir are stopped, also when their group's leader is gone."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import sleeper, survives

from tpuflow.cost.reaper import FixedRunStates, ReaperScope, collect_orphans, reap
from tpuflow.local import cluster as cluster_mod
from tpuflow.local.cluster import CLUSTER_ENV, STATE_FILE, LocalRayCluster, NodeProcess
from tpuflow.local.operators import local_cluster_name
from tpuflow.naming import TaskIdentity

OWNER = TaskIdentity("ownership_dag", "manual__1", "start_cluster")


def _cluster(base: Path, pids: list[int], name: str = "fake", temp: str | None = None) -> LocalRayCluster:
    """A cluster loaded back from the state.json its start would have written, its nodes at `pids`."""
    state_dir = base / name
    state_dir.mkdir(parents=True)
    temp_dir = temp if temp is not None else str(base / f"tpf-{name}")
    if temp_dir:
        Path(temp_dir).mkdir(exist_ok=True)
    nodes = [NodeProcess(role="head", pid=pids[0], log="", temp_dir=f"{temp_dir}/n0")]
    nodes += [
        NodeProcess(
            role="tpu-host", pid=pid, log="", slice_name="fake-slice-0", worker_id=i, temp_dir=f"{temp_dir}/n{i}"
        )
        for i, pid in enumerate(pids[1:], 1)
    ]
    LocalRayCluster(
        name=name, state_dir=str(state_dir), temp_dir=temp_dir, gcs_address="127.0.0.2:1", dashboard_url="",
        serve_port=1, slice=None, nodes=nodes, started_at=time.time() - 7200, owner=OWNER.record(),
    ).save()  # fmt: skip
    return LocalRayCluster.load(state_dir)


def _gone(proc: subprocess.Popen, timeout: float = 10.0) -> bool:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_stop_leaves_a_process_that_took_over_a_recorded_pid_and_calls_the_cluster_gone(
    tmp_path: Path, procs: list[subprocess.Popen], caplog: pytest.LogCaptureFixture
) -> None:
    bystander = sleeper(procs)
    cluster = _cluster(tmp_path, [bystander.pid])

    assert not cluster.is_alive(), "a recorded pid that is another process's is no node of the cluster"
    with caplog.at_level(logging.INFO, logger=cluster_mod.__name__):
        signalled = cluster.stop(grace=0.5, timeout=2)

    assert signalled == []
    assert survives(bystander), "the unrelated process was signalled"
    assert not (Path(cluster.state_dir) / STATE_FILE).exists(), "the cluster is stopped: its state is gone"
    assert f"pid {bystander.pid} is no longer one of its processes" in caplog.text


@pytest.mark.parametrize("how", ["environment", "command line"])
def test_stop_stops_a_process_that_names_the_cluster(tmp_path: Path, procs: list[subprocess.Popen], how: str) -> None:
    temp_dir = str(tmp_path / "tpf-x")
    if how == "environment":
        node = sleeper(procs, env={**os.environ, CLUSTER_ENV: temp_dir})
    else:
        node = sleeper(procs, f"--temp-dir={temp_dir}/n0")
    bystander = sleeper(procs, f"{temp_dir}0")  # a path that only starts with the temp dir: not the cluster's
    cluster = _cluster(tmp_path, [node.pid, bystander.pid], temp=temp_dir)
    assert cluster.is_alive()

    signalled = cluster.stop(grace=0.5, timeout=5)

    assert node.pid in signalled and _gone(node)
    assert bystander.pid not in signalled and survives(bystander)


def test_a_group_whose_leader_is_gone_has_its_marked_members_stopped_by_pid(
    tmp_path: Path, procs: list[subprocess.Popen]
) -> None:
    """The leader (`ray start`) exited; what it started stays in its process group, carrying the variable."""
    temp_dir = str(tmp_path / "tpf-x")
    member = (
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(p.pid, flush=True)"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", member],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, CLUSTER_ENV: temp_dir},
    )
    procs.append(leader)
    member_pid = int(leader.stdout.readline())  # type: ignore[union-attr]
    leader.wait(timeout=30)
    try:
        assert cluster_mod._pgrp_of(member_pid) == leader.pid
        cluster = _cluster(tmp_path, [leader.pid], temp=temp_dir)
        assert cluster.is_alive()

        signalled = cluster.stop(grace=0.5, timeout=5)

        assert signalled == [member_pid]
        deadline = time.monotonic() + 10
        while cluster_mod._live(member_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cluster_mod._live(member_pid)
    finally:
        if cluster_mod._live(member_pid) and cluster_mod._pgrp_of(member_pid) == leader.pid:
            os.kill(member_pid, signal.SIGKILL)


def test_no_temp_dir_recorded_proves_nothing(tmp_path: Path, procs: list[subprocess.Popen]) -> None:
    """An empty temp dir would name every path: a state without one owns no process."""
    bystander = sleeper(procs, env={**os.environ, CLUSTER_ENV: ""})
    cluster = _cluster(tmp_path, [bystander.pid], temp="")
    assert not cluster.is_alive()
    assert cluster.stop(grace=0.5, timeout=2) == []
    assert survives(bystander)


def test_kill_host_leaves_a_process_that_took_over_the_hosts_pid(tmp_path: Path, procs: list[subprocess.Popen]) -> None:
    temp_dir = str(tmp_path / "tpf-x")
    head = sleeper(procs, env={**os.environ, CLUSTER_ENV: temp_dir})
    bystander = sleeper(procs)
    cluster = _cluster(tmp_path, [head.pid, bystander.pid], temp=temp_dir)

    cluster.kill_host(0, 1)

    assert survives(bystander)
    assert survives(head), "only the host was asked for"


def test_the_reaper_leaves_a_process_that_took_over_a_dead_clusters_pid(
    tmp_path: Path, procs: list[subprocess.Popen]
) -> None:
    """`tpuflow reap` after a reboot: the cluster's state names a pid that is now an unrelated process."""
    bystander = sleeper(procs)
    name = local_cluster_name(OWNER)
    _cluster(tmp_path, [bystander.pid], name=name)

    scope = ReaperScope(local_base_dir=str(tmp_path), kube=False, leases=False)
    orphans = collect_orphans(scope, FixedRunStates({}), older_than=0)
    outcome = reap(orphans, dry_run=False, say=lambda line: None)

    assert [o.name for o in orphans] == [name]
    assert "processes are gone" in orphans[0].reason
    assert outcome["deleted"] == [orphans[0].line()]
    assert survives(bystander), "tpuflow reap signalled a process that is not the cluster's"
    assert not (tmp_path / name / STATE_FILE).exists()
