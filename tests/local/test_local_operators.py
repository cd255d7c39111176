"""Kill semantics of LocalRayClusterCreateOperator, without Ray: the node start is replaced by a process
that only sleeps, in its own session like a Ray node, so the test sees exactly what a kill leaves behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowTaskTerminated
from tpuflow.local import cluster as cluster_mod
from tpuflow.local.cluster import STATE_FILE, LocalRayCluster, NodeProcess
from tpuflow.local.operators import LocalRayClusterCreateOperator, local_cluster_name


class FakeTI:
    dag_id, run_id, task_id = "local_dag", "manual__1", "start_cluster"

    def xcom_push(self, key: str, value: Any) -> None:
        pass


def _alive(pid: int) -> bool:
    return cluster_mod._group_alive(pid)


def test_killing_the_create_task_while_the_cluster_starts_stops_the_nodes_it_started(tmp_path, monkeypatch):
    spawned: list[int] = []

    def start_head(self: LocalRayCluster, cpus: int, env: dict[str, str], timeout: float) -> None:
        # Like _spawn: a node in its own session, recorded in the state file; then the wait for the dashboard.
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        spawned.append(proc.pid)
        self.nodes.append(NodeProcess(role="head", pid=proc.pid, log=str(tmp_path / "head.log")))
        self.save()
        time.sleep(8)

    def start_host(*args: Any, **kwargs: Any) -> None:
        raise cluster_mod.LocalClusterError("the start went on past the kill")  # never a real `ray start`

    monkeypatch.setattr(LocalRayCluster, "_start_head", start_head)
    monkeypatch.setattr(LocalRayCluster, "_start_host", start_host)
    monkeypatch.setattr(cluster_mod, "_available_memory", lambda: 1 << 40)
    op = LocalRayClusterCreateOperator(task_id="start_cluster", accelerator="v6e", topology="2x2",
                                       base_dir=str(tmp_path))
    # The task runner's SIGTERM handler calls on_kill in the task process's main thread.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: op.on_kill())
    killer = threading.Thread(target=lambda: (_wait_for(spawned), os.kill(os.getpid(), signal.SIGTERM)))
    try:
        killer.start()
        started = time.monotonic()
        with pytest.raises(AirflowTaskTerminated):
            op.execute({"ti": FakeTI()})
        assert time.monotonic() - started < 6
    finally:
        signal.signal(signal.SIGTERM, previous)
        killer.join(timeout=5)
        for pid in spawned:
            cluster_mod._signal_group(pid, signal.SIGKILL)

    state_dir = Path(tmp_path) / local_cluster_name(FakeTI.dag_id, FakeTI.run_id, FakeTI.task_id)
    assert spawned and not _alive(spawned[0])
    assert not (state_dir / STATE_FILE).exists()
    op.on_kill()  # once execute has ended there is nothing left to stop


def _wait_for(spawned: list[int]) -> None:
    deadline = time.monotonic() + 10
    while not spawned and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
