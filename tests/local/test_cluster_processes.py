"""What LocalRayCluster's start retries and stop leave behind, without Ray: each "node" is a process in
its own session, like `ray start --block`, with a child in its group and a stray that left the group
(as some Ray processes do) but names the node's temp dir on its command line, as Ray's processes do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuflow.local import cluster as cluster_mod
from tpuflow.local.cluster import LocalClusterError, LocalRayCluster, NodeProcess

NODE = """
import signal, subprocess, sys, time
temp = sys.argv[1]
stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", temp + "/session"],
                         start_new_session=True)
child = subprocess.Popen(["sleep", "300"])
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as Ray's gcs_server does: only SIGKILL ends it
with open(temp + "/pids.tmp", "w") as f:
    f.write(f"{stray.pid} {child.pid}")
import os; os.replace(temp + "/pids.tmp", temp + "/pids")
time.sleep(300)
"""


def _live(pid: int) -> bool:
    return cluster_mod._live(pid)


def _wait_file(path: Path) -> list[int]:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return [int(x) for x in path.read_text().split()]


@pytest.fixture
def cluster(tmp_path: Path):
    (tmp_path / "state").mkdir()
    (tmp_path / "t").mkdir()
    made = LocalRayCluster(
        name="fake",
        state_dir=str(tmp_path / "state"),
        temp_dir=str(tmp_path / "t"),
        gcs_address="",
        dashboard_url="",
        serve_port=0,
        slice=None,
    )
    bystanders: list[subprocess.Popen] = []
    yield made, bystanders
    for node in made.nodes:
        cluster_mod._signal_group(node.pid, signal.SIGKILL)
    for pid in cluster_mod._pids_referencing(made.temp_dir):  # the strays, which left the groups
        os.kill(pid, signal.SIGKILL)
    for proc in bystanders:
        proc.kill()
        proc.wait()


def _spawner(cluster: LocalRayCluster, attempts: list[dict]):
    def spawn() -> None:
        node_temp = f"{cluster.temp_dir}/n{len(attempts)}"
        os.makedirs(node_temp)
        proc = subprocess.Popen([sys.executable, "-c", NODE, node_temp], start_new_session=True)
        attempts.append({"leader": proc, "temp": node_temp})
        cluster.nodes.append(NodeProcess(role="head", pid=proc.pid, log="", temp_dir=node_temp))

    return spawn


def test_a_failed_start_attempt_leaves_none_of_its_processes_and_the_retry_runs(cluster) -> None:
    cluster, bystanders = cluster
    attempts: list[dict] = []
    # Another process naming a path that merely starts with the first node's temp dir: not ours.
    bystanders.append(
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", f"{cluster.temp_dir}/n00"])
    )

    def ready(_timeout: float) -> None:
        attempts[-1]["pids"] = _wait_file(Path(attempts[-1]["temp"]) / "pids")
        if len(attempts) == 1:
            raise LocalClusterError("the node did not register")  # as a raylet missing its start deadline

    cluster._start_with_retries(_spawner(cluster, attempts), ready, timeout=60)

    first, second = attempts
    assert [n.pid for n in cluster.nodes] == [second["leader"].pid]
    first["leader"].wait(timeout=30)
    assert not any(_live(p) for p in first["pids"]), "the failed attempt's child and stray are gone"
    assert _live(second["leader"].pid) and all(_live(p) for p in second["pids"])
    assert bystanders[0].poll() is None, "a process that only shares a path prefix is left alone"


def test_stop_escalates_to_sigkill_for_what_ignores_sigterm_and_leaves_nothing(cluster) -> None:
    cluster, _ = cluster
    attempts: list[dict] = []
    _spawner(cluster, attempts)()
    pids = _wait_file(Path(attempts[0]["temp"]) / "pids")
    leader = attempts[0]["leader"]

    signalled = cluster.stop(grace=0.5)

    assert leader.pid in signalled and pids[0] in signalled  # the group, then the stray by its temp dir
    assert not _live(leader.pid), "it ignored SIGTERM, so stop escalated to SIGKILL"
    assert not any(_live(p) for p in pids)
    assert not cluster_mod._group_alive(leader.pid)
    assert cluster_mod._pids_referencing(cluster.temp_dir) == []
    assert not Path(cluster.temp_dir).exists()


@pytest.mark.parametrize(("load", "expected"), [(0.5, 90.0), (12.0, 540.0), (100.0, 600.0)])
def test_a_start_attempt_gets_longer_on_a_loaded_machine(cluster, monkeypatch, load, expected) -> None:
    cluster, _ = cluster
    monkeypatch.setattr(cluster_mod.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(cluster_mod.os, "cpu_count", lambda: 2)
    given: list[float] = []
    cluster._start_with_retries(lambda: None, given.append, timeout=600)
    assert given == [expected]
