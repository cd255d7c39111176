"""Kill semantics of LocalRayCreateClusterOperator, without Ray: the node start is replaced by a process
that only sleeps, in its own session like a Ray node, so the test sees exactly what a kill leaves behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowTaskTerminated
from support.airflow_context import task_context

from tpuflow.local import cluster as cluster_mod
from tpuflow.local.cluster import CLUSTER_ENV, STATE_FILE, LocalRayCluster, NodeProcess
from tpuflow.local.operators import LocalRayCreateClusterOperator, LocalRayDeleteClusterOperator, local_cluster_name
from tpuflow.naming import TaskIdentity

START_TASK = {"dag_id": "local_dag", "run_id": "manual__1", "task_id": "start_cluster"}
V6E_2X2 = {"accelerator": "v6e", "topology": "2x2"}


def _alive(pid: int) -> bool:
    return cluster_mod._group_alive(pid)


def test_killing_the_create_task_while_the_cluster_starts_stops_the_nodes_it_started(tmp_path, monkeypatch):
    spawned: list[int] = []

    def start_head(self: LocalRayCluster, cpus: int, env: dict[str, str], timeout: float) -> None:
        # Like _spawn: a node in its own session carrying the cluster's variable, recorded in the state file;
        # then the wait for the dashboard.
        env = {**os.environ, cluster_mod.CLUSTER_ENV: self.temp_dir}
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True, env=env)
        spawned.append(proc.pid)
        self.nodes.append(NodeProcess(role="head", pid=proc.pid, log=str(tmp_path / "head.log")))
        self.save()
        time.sleep(8)

    def start_host(*args: Any, **kwargs: Any) -> None:
        raise cluster_mod.LocalClusterError("the start went on past the kill")  # never a real `ray start`

    monkeypatch.setattr(LocalRayCluster, "_start_head", start_head)
    monkeypatch.setattr(LocalRayCluster, "_start_host", start_host)
    monkeypatch.setattr(cluster_mod, "_available_memory", lambda: 1 << 40)
    op = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=V6E_2X2, base_dir=str(tmp_path))
    # The task runner's SIGTERM handler calls on_kill in the task process's main thread.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: op.on_kill())
    killer = threading.Thread(target=lambda: (_wait_for(spawned), os.kill(os.getpid(), signal.SIGTERM)))
    try:
        killer.start()
        started = time.monotonic()
        with pytest.raises(AirflowTaskTerminated):
            op.execute(task_context(**START_TASK))
        assert time.monotonic() - started < 6
    finally:
        signal.signal(signal.SIGTERM, previous)
        killer.join(timeout=5)
        for pid in spawned:
            cluster_mod._signal_group(pid, signal.SIGKILL)

    state_dir = Path(tmp_path) / local_cluster_name(TaskIdentity(**START_TASK))
    assert spawned and not _alive(spawned[0])
    assert not (state_dir / STATE_FILE).exists()
    op.on_kill()  # once execute has ended there is nothing left to stop


def _wait_for(spawned: list[int]) -> None:
    deadline = time.monotonic() + 10
    while not spawned and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)


def mapped(map_index: int, task_id: str = "start_cluster") -> dict[str, Any]:
    """The context of one mapped instance of the start task's DAG run (-1: unmapped)."""
    return task_context(**{**START_TASK, "task_id": task_id, "map_index": map_index})


def test_mapped_instances_of_the_start_task_get_a_cluster_each_and_their_deletes_find_it(tmp_path, monkeypatch):
    names = {local_cluster_name(TaskIdentity.from_context(mapped(i))) for i in (-1, 0, 1, 2)}
    assert len(names) == 4  # unmapped and three mapped instances: four clusters
    assert all(len(n) <= 48 and n.startswith("local-local-dag-") for n in names)
    # A retry (same instance) gets the same name; the name does not depend on the try.
    assert local_cluster_name(TaskIdentity("local_dag", "manual__1", "start_cluster", 1)) == local_cluster_name(
        TaskIdentity.from_context(mapped(1))
    )

    seen: list[Any] = []  # cluster names start() was asked for, then state dirs load() was asked for

    def start(cls: type, tpu: Any, name: str, base_dir: Any, **kwargs: Any) -> LocalRayCluster:
        seen.append(name)
        raise cluster_mod.LocalClusterError("not starting Ray in this test")

    def load(cls: type, state_dir: Path) -> LocalRayCluster:
        seen.append(state_dir)
        raise cluster_mod.LocalClusterError("loaded")

    monkeypatch.setattr(LocalRayCluster, "start", classmethod(start))
    monkeypatch.setattr(LocalRayCluster, "load", classmethod(load))
    for index in (0, 1):
        op = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=V6E_2X2, base_dir=str(tmp_path))
        with pytest.raises(cluster_mod.LocalClusterError, match="not starting"):
            op.execute(mapped(index))
    started = list(seen)
    assert len(set(started)) == 2
    # Each mapped delete (same map index) looks for its own instance's cluster.
    for index, name in zip((0, 1), started, strict=True):
        (tmp_path / name).mkdir(mode=0o700)  # as start() makes it
        (tmp_path / name / STATE_FILE).write_text("{}")
        seen.clear()
        delete = LocalRayDeleteClusterOperator(task_id="stop_cluster", base_dir=str(tmp_path))
        with pytest.raises(cluster_mod.LocalClusterError, match="loaded"):
            delete.execute(mapped(index, task_id="stop_cluster"))
        assert seen == [tmp_path / name]


def test_the_slice_is_checked_at_parse_time_when_static_and_once_rendered_when_templated(tmp_path):
    from tpuflow.errors import UserInputError

    with pytest.raises(UserInputError, match=r"^tpu_slice\.topology='16'"):
        LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice={"accelerator": "v6e", "topology": "16"})
    templated = {"accelerator": "{{ params.accelerator }}", "topology": "{{ params.topology }}"}
    op = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=templated, base_dir=str(tmp_path))
    assert op.tpu_slice == templated  # assigned as given, not checked yet
    op.render_template_fields({"params": {"accelerator": "v6e", "topology": "16"}})
    assert op.tpu_slice == {"accelerator": "v6e", "topology": "16"}  # each value rendered
    with pytest.raises(UserInputError, match=r"^tpu_slice\.topology='16'"):
        op.execute(task_context(**START_TASK))
    assert not list(tmp_path.iterdir())  # nothing started


def test_a_templated_slice_renders_and_is_what_the_cluster_simulates(tmp_path, monkeypatch):
    from tpuflow.tpu import TpuSlice

    asked: list[Any] = []

    def start(cls: type, tpu: Any, name: str, base_dir: Any, **kwargs: Any) -> LocalRayCluster:
        asked.append(tpu)
        raise cluster_mod.LocalClusterError("not starting Ray in this test")

    monkeypatch.setattr(LocalRayCluster, "start", classmethod(start))
    templated = {"accelerator": "v6e", "topology": "{{ params.topology }}", "machine_type": "ct6e-standard-4t",
                 "num_slices": "{{ params.num_slices }}"}  # fmt: skip
    op = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=templated, base_dir=str(tmp_path))
    op.render_template_fields({"params": {"topology": "2x4", "num_slices": "2"}})
    with pytest.raises(cluster_mod.LocalClusterError):
        op.execute(task_context(**START_TASK))
    assert asked == [TpuSlice.from_spec("v6e", "2x4", "ct6e-standard-4t", 2)]


def test_the_old_slice_arguments_are_refused():
    with pytest.raises(TypeError, match="tpu_slice"):
        LocalRayCreateClusterOperator(task_id="start_cluster", accelerator="v6e", topology="2x2")
    with pytest.raises(TypeError, match="num_slices"):
        LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=V6E_2X2, num_slices=2)


def test_the_cluster_records_when_it_expires(tmp_path, monkeypatch):
    """expires_after (default 24 hours, as a node pool's tpuflow-expires) from the start is recorded in the
    cluster's state as expires_at, which the orphan reaper reads; None: never expires."""
    from datetime import timedelta

    asked: list[Any] = []

    def start(cls: type, tpu: Any, name: str, base_dir: Any, **kwargs: Any) -> LocalRayCluster:
        asked.append(kwargs.get("expires_at", "missing"))
        raise cluster_mod.LocalClusterError("not starting Ray in this test")

    monkeypatch.setattr(LocalRayCluster, "start", classmethod(start))
    for expires_after in ((), (timedelta(hours=2),), (None,)):
        kw = {"expires_after": expires_after[0]} if expires_after else {}
        op = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=V6E_2X2, base_dir=str(tmp_path), **kw)
        with pytest.raises(cluster_mod.LocalClusterError):
            op.execute(task_context(**START_TASK))
    now = time.time()
    assert abs(asked[0] - (now + 24 * 3600)) < 5 and abs(asked[1] - (now + 7200)) < 5 and asked[2] is None
    # the state file keeps it (and a state written before the field existed loads as "never")
    state = tmp_path / "state"
    state.mkdir()
    cluster = LocalRayCluster(name="local-x", state_dir=str(state), temp_dir="", gcs_address="", dashboard_url="",
                              serve_port=1, slice=None, expires_at=now)  # fmt: skip
    cluster.save()
    assert LocalRayCluster.load(state).expires_at == now
    data = {k: v for k, v in json.loads((state / STATE_FILE).read_text()).items() if k != "expires_at"}
    (state / STATE_FILE).write_text(json.dumps(data))
    assert LocalRayCluster.load(state).expires_at is None


def test_keeping_the_cluster_marks_it_kept_and_the_reaper_leaves_it_while_it_runs(tmp_path):
    """keep (keep_endpoint): the delete task stops nothing and records ``kept`` in state.json (its expiry dropped);
    the reaper then leaves the cluster whatever its run's state or expiry, and counts it as kept; once its
    processes are gone it is cleaned like any dead cluster. A state written before the field loads as not kept."""
    from tpuflow.cost.reaper import find_local_orphans, local_orphan_reason, reap

    temp_dir = str(tmp_path / "t")  # the head's process group, marked as the cluster's processes are
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True, env={**os.environ, CLUSTER_ENV: temp_dir})
    try:
        name = local_cluster_name(TaskIdentity.from_context(task_context(**START_TASK)))
        state_dir = tmp_path / name
        state_dir.mkdir(mode=0o700)  # as start() makes it
        now = time.time()
        LocalRayCluster(name=name, state_dir=str(state_dir), temp_dir=temp_dir, gcs_address="", dashboard_url="",
                        serve_port=1, slice=None, nodes=[NodeProcess(role="head", pid=sleeper.pid, log="")],
                        started_at=now - 7200, expires_at=now - 60,
                        owner=TaskIdentity.from_context(task_context(**START_TASK)).record()).save()  # fmt: skip
        assert LocalRayCluster.load(state_dir).kept is False
        # past its expiry and its run over: an orphan, until it is kept
        assert [o.name for o in find_local_orphans({}, older_than=0, now=now, base_dir=tmp_path)] == [name]

        stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", keep="True", base_dir=str(tmp_path))
        stop.execute(task_context(**{**START_TASK, "task_id": "stop_cluster"}))
        assert _alive(sleeper.pid)  # nothing stopped
        state = json.loads((state_dir / STATE_FILE).read_text())
        assert state["kept"] is True and state["expires_at"] is None

        kept: list[Any] = []
        assert find_local_orphans({}, older_than=0, now=now, base_dir=tmp_path, kept=kept) == []
        assert [(k.kind, k.name) for k in kept] == [("local_cluster", name)]
        said: list[str] = []
        outcome = reap([], dry_run=True, say=said.append, kept=kept)
        assert said[0].startswith("skipped 1 kept endpoint resource(s) (keep_endpoint): still running, and billed")
        assert outcome["kept"] == [kept[0].line()] and outcome["found"] == []
        # whatever the expiry it may still carry, and for a reaper that covers only other DAGs
        assert local_orphan_reason(name, True, {}, None, now - 60, now, kept=True) is None
        assert local_orphan_reason(name, True, {}, ["other_dag"], None, now, kept=True) is None
        # its processes gone: nothing is left to keep, so it is cleaned
        os.killpg(sleeper.pid, signal.SIGKILL)
        sleeper.wait()
        kept.clear()
        [orphan] = find_local_orphans({}, older_than=0, now=now, base_dir=tmp_path, kept=kept)
        assert orphan.name == name and "processes are gone" in orphan.reason and kept == []
    finally:
        if sleeper.poll() is None:
            os.killpg(sleeper.pid, signal.SIGKILL)
            sleeper.wait()
