"""The embedded cluster behaves like TPU slices: Ray's own slice labels and slice_placement_group work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import cmdline
from support.ray_cluster import run_job

from tpuflow.errors import UserInputError
from tpuflow.local import cluster as cluster_mod
from tpuflow.local.cluster import LocalRayCluster, _pids_referencing
from tpuflow.rayjob.hooks import RayJobHook, parse_result
from tpuflow.tpu import TpuSlice

DRIVERS = Path(__file__).parent / "drivers"
pytestmark = pytest.mark.slow
SLICE = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t")  # one slice of the session's slice_cluster


def test_hosts_carry_the_labels_ray_derives_on_real_slices(slice_cluster):
    tpu_nodes = [n for n in slice_cluster.nodes_summary() if n["resources_total"].get("TPU")]
    assert len(tpu_nodes) == 4
    by_slice: dict[str, set[str]] = {}
    for node in tpu_nodes:
        labels = node["labels"]
        assert labels["ray.io/tpu-pod-type"] == "v6e-8"
        assert labels["ray.io/tpu-topology"] == "2x4"
        assert labels["ray.io/accelerator-type"] == "TPU-V6E"
        assert node["resources_total"]["TPU"] == 4
        by_slice.setdefault(labels["ray.io/tpu-slice-name"], set()).add(labels["ray.io/tpu-worker-id"])
        # Ray gives worker 0 of each slice the head resource slice_placement_group reserves first.
        assert ("TPU-v6e-8-head" in node["resources_total"]) == (labels["ray.io/tpu-worker-id"] == "0")
    assert by_slice == {f"pytest-v6e-slice-{i}": {"0", "1"} for i in range(2)}


def _run_probe(cluster: LocalRayCluster, reservations: int) -> dict:
    kwargs = json.dumps(SLICE.slice_placement_group_kwargs())
    logs = run_job(cluster, f"placement_probe.py '{kwargs}' {reservations}", {"working_dir": str(DRIVERS)}, timeout=300)
    return parse_result(logs)


def test_slice_placement_group_reserves_whole_slices_without_mixing(slice_cluster):
    result = _run_probe(slice_cluster, reservations=2)
    assert result["num_hosts"] == [2, 2]
    first, second = result["reservations"]
    for hosts in (first, second):
        assert len({h["node"] for h in hosts}) == 2, "one task per host"
        assert len({h["slice"] for h in hosts}) == 1, "every host of a reservation is in one slice"
        assert sorted(h["worker"] for h in hosts) == ["0", "1"]
    assert first[0]["slice"] != second[0]["slice"], "the second reservation got the other slice"


def test_start_adopts_a_live_cluster_and_rejects_a_different_slice(slice_cluster, cluster_base_dir):
    same = LocalRayCluster.start(
        TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t", num_slices=2), "pytest-v6e", cluster_base_dir
    )
    assert same.dashboard_url == slice_cluster.dashboard_url
    with pytest.raises(UserInputError, match="different slice"):
        LocalRayCluster.start(TpuSlice.from_spec("TPU-V6E", "2x2"), "pytest-v6e", cluster_base_dir)


def test_refuses_a_slice_the_machine_cannot_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster_mod, "_available_memory", lambda: 2 << 30)
    with pytest.raises(UserInputError) as err:
        LocalRayCluster.start(TpuSlice.from_spec("TPU-V6E", "4x8"), "too-big", tmp_path)
    assert err.value.field == "topology" and "smaller slice" in str(err.value)
    assert not (tmp_path / "too-big").exists()


def test_cli_up_status_down_leaves_no_process(tmp_path):
    cli = [sys.executable, "-m", "tpuflow.cli", "local"]
    base = ["--name", "cli-test", "--base-dir", str(tmp_path)]
    up = subprocess.run(
        [*cli, "up", "--accelerator", "v6e", "--topology", "2x2", *base], capture_output=True, text=True, timeout=600
    )
    assert up.returncode == 0, up.stderr[-3000:]
    state = LocalRayCluster.load(tmp_path / "cli-test")
    try:
        info = json.loads(up.stdout)
        assert state.is_alive() and info["dashboard_url"] == state.dashboard_url
        status = subprocess.run(
            [*cli, "status", "--base-dir", str(tmp_path)], capture_output=True, text=True, timeout=60
        )
        assert "cli-test: running; v6e 2x2; 2 Ray nodes" in status.stdout
    except BaseException:
        state.stop()  # a failed check leaves no cluster behind
        raise
    down = subprocess.run([*cli, "down", *base], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0 and "stopped cli-test" in down.stdout
    assert _pids_referencing(state.temp_dir) == []
    assert not any(cluster_mod._group_alive(n.pid) for n in state.nodes)


def test_a_long_cluster_names_slices_stay_valid_ray_label_values() -> None:
    """Ray refuses a slice_placement_group selector over 63 characters; a RayService's cluster on the
    stand-ins (namespace-service-raycluster-suffix-uid) is that long, and its multi-host replica could not
    reserve its slice."""
    import re

    from tpuflow.local.cluster import slice_name

    assert slice_name("bench-2x4", 0) == "bench-2x4-slice-0"  # short names unchanged
    long = "default-tpu-llm-pipeline-gke-deploy-d4ad7b5bd7-raycluster-fb5a3-7e1bebd9"
    names = [slice_name(long, i) for i in range(3)]
    other = slice_name(long.replace("7e1bebd9", "00000000"), 0)
    for name in [*names, other]:
        assert len(name) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", name), name
    assert len({*names, other}) == 4 and all(n.startswith("default-tpu-llm-pipeline") for n in names)


def test_a_start_killed_half_way_is_stopped_by_the_next_start_not_adopted(tmp_path: Path) -> None:
    """A task SIGKILLed while its cluster was starting (head up, hosts not yet): its retry must not adopt the
    half-started cluster, and nothing the killed start spawned may outlive the retry's cluster."""
    import os
    import signal
    import time

    starter = (
        "import sys; from tpuflow.local.cluster import LocalRayCluster; from tpuflow.tpu import TpuSlice; "
        "LocalRayCluster.start(TpuSlice.from_spec('TPU-V6E', '2x4', 'ct6e-standard-4t'), 'half', sys.argv[1], timeout=300)"
    )
    proc = subprocess.Popen([sys.executable, "-c", starter, str(tmp_path)])
    state_file = tmp_path / "half" / cluster_mod.STATE_FILE
    deadline = time.time() + 300
    while time.time() < deadline:  # the head is up and the first host is starting: kill the starter there
        if state_file.exists() and sum(n["role"] == "tpu-host" for n in json.loads(state_file.read_text())["nodes"]):
            break
        assert proc.poll() is None, "the start ended before it could be killed"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    half = LocalRayCluster.load(tmp_path / "half")
    assert not half.complete and half.is_alive(), "the killed start left a live, incomplete cluster behind"

    retry = LocalRayCluster.start(SLICE, "half", tmp_path, timeout=300)  # two 4-chip hosts
    try:
        assert retry.complete and retry.temp_dir != half.temp_dir
        assert len(retry.nodes) == 3 and all(cluster_mod._group_alive(n.pid) for n in retry.nodes)
        assert not any(cluster_mod._group_alive(n.pid) for n in half.nodes)
        assert _pids_referencing(half.temp_dir) == [], "processes of the killed start outlived the retry"
    finally:
        retry.stop()
    assert _pids_referencing(retry.temp_dir) == []


def test_stop_returns_only_once_every_ray_worker_is_gone(tmp_path: Path) -> None:
    """Ray's workers (actors, idle workers) leave the nodes' process groups and name themselves ray::...; stop()
    used to return while they were still exiting. It finds them by the cluster's marker in their environment."""
    cluster = LocalRayCluster.start(TpuSlice.from_spec("TPU-V6E", "2x2"), "workers", tmp_path, timeout=300)
    try:
        hook = RayJobHook(cluster=cluster.connection_info())
        sid = hook.submit_job(
            entrypoint="python detached_actors.py 3",
            submission_id="detached",
            runtime_env={"working_dir": str(DRIVERS)},
        )
        import time

        deadline = time.time() + 300
        while hook.get_job_status(sid) not in ("SUCCEEDED", "FAILED", "STOPPED") and time.time() < deadline:
            time.sleep(1)
        assert hook.get_job_status(sid) == "SUCCEEDED", hook.get_job_logs(sid)[-2000:]
        workers = [p for p in _pids_referencing(cluster.temp_dir) if "ray::" in cmdline(p)]
        assert len([p for p in workers if "ray::Pinger" in cmdline(p)]) == 3, workers
    finally:
        cluster.stop()
    assert _pids_referencing(cluster.temp_dir) == [], "Ray workers outlived stop()"


def test_a_preemption_interrupted_inside_its_notice_still_ends_with_the_host_replaced(monkeypatch, tmp_path) -> None:
    """A drained Ray node never takes work again: Ctrl-C during the notice kills it and starts its replacement
    rather than leave the slice with a host nothing can use."""
    calls: list[str] = []
    cluster = LocalRayCluster("c", str(tmp_path), "/nonexistent", "", "", 0, None)
    monkeypatch.setattr(cluster, "drain_host", lambda s, w, n: calls.append(f"drain {s}/{w} {n}") or 1e12)
    monkeypatch.setattr(cluster, "kill_host", lambda s, w: calls.append(f"kill {s}/{w}") or 42)
    monkeypatch.setattr(cluster, "replace_host", lambda s, w, t: calls.append(f"replace {s}/{w}"))

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster_mod.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cluster.preempt_host(0, 1, notice_s=30)
    assert calls == ["drain 0/1 30", "kill 0/1", "replace 0/1"]
    assert LocalRayCluster.load(tmp_path).pending_preemption is None


class _Killed(BaseException):
    """SIGKILL: nothing of the process runs after it (no except, no finally that does work)."""


def test_a_preemption_whose_command_was_killed_is_finished_by_the_next_run_that_adopts_the_cluster(
    monkeypatch, tmp_path
) -> None:
    """`kill -9` of `tpuflow local preempt` during the notice leaves the host drained; the state says so, and the
    next adoption of the cluster (a run's start_cluster) kills and replaces that host before using the slice."""
    calls: list[str] = []
    base = tmp_path / "clusters"
    cluster = LocalRayCluster("c", str(base / "c"), "/nonexistent", "", "", 0, {"fake": "slice"})
    (base / "c").mkdir(parents=True)

    def killed(seconds: float) -> None:
        raise _Killed

    monkeypatch.setattr(cluster, "drain_host", lambda s, w, n: calls.append(f"drain {s}/{w}") or 1e12)
    monkeypatch.setattr(cluster_mod.time, "sleep", killed)
    with pytest.raises(_Killed):
        cluster.preempt_host(0, 1, notice_s=30)
    assert calls == ["drain 0/1"]  # killed inside the notice: the host stays drained
    assert LocalRayCluster.load(base / "c").pending_preemption == {"slice_index": 0, "worker_id": 1}

    monkeypatch.setattr(LocalRayCluster, "is_alive", lambda self: True)
    monkeypatch.setattr(LocalRayCluster, "kill_host", lambda self, s, w: calls.append(f"kill {s}/{w}") or 42)
    monkeypatch.setattr(LocalRayCluster, "replace_host", lambda self, s, w, t: calls.append(f"replace {s}/{w}"))
    monkeypatch.setattr(cluster_mod.TpuSlice, "to_dict", lambda self: {"fake": "slice"})
    adopted = LocalRayCluster.start(cluster_mod.TpuSlice.from_spec("TPU-V6E", "2x4"), "c", base)
    assert calls == ["drain 0/1", "kill 0/1", "replace 0/1"]
    assert adopted.pending_preemption is None and LocalRayCluster.load(base / "c").pending_preemption is None
    assert adopted.finish_preemption() is False  # nothing left to finish


def test_sigterm_to_tpuflow_local_preempt_inside_its_notice_is_an_interrupt(monkeypatch) -> None:
    """`kill PID` of the command during the notice reaches preempt_host's cleanup (as Ctrl-C does) instead of
    ending the process with the host left drained; the command exits 130."""
    import os
    import signal
    import time

    from tpuflow.cli import local_cmd, main

    seen: list[str] = []

    class Cluster:
        name = "c"

        def finish_preemption(self) -> bool:
            return False

        def preempt_host(self, *args, **kwargs):
            try:  # the handler raises as soon as the signal is delivered
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            except KeyboardInterrupt:
                seen.append("interrupted")
                raise

    monkeypatch.setattr(local_cmd, "_clusters", lambda args: [Cluster()])
    before = signal.getsignal(signal.SIGTERM)
    assert main(["local", "preempt", "--host", "1", "--notice", "30s"]) == 130
    assert seen == ["interrupted"] and signal.getsignal(signal.SIGTERM) == before


def test_kill_9_of_tpuflow_local_preempt_inside_its_notice_blocks_no_later_run(tmp_path: Path) -> None:
    """The real command, SIGKILLed while its host is drained: the next start_cluster adopting the cluster kills
    and replaces that host, so the slice has all its hosts alive and none draining."""
    import os
    import signal

    from support.ray_cluster import running_cluster

    base = tmp_path / "clusters"
    with running_cluster("kill9", base, "TPU-V6E", "2x4", "ct6e-standard-4t") as cluster:
        ip = cluster_mod.host_ip(0, 1, 2)
        before = {n["node_id"] for n in cluster.nodes_summary() if n.get("node_ip") == ip}
        cmd = [sys.executable, "-m", "tpuflow.cli", "local", "preempt", "--base-dir", str(base), "--name", "kill9",
               "--host", "1", "--notice", "300s"]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            assert line.startswith("drained simulated TPU host 0/1"), line
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        assert LocalRayCluster.load(cluster.state_dir).pending_preemption == {"slice_index": 0, "worker_id": 1}

        adopted = LocalRayCluster.start(SLICE, "kill9", base, head_cpus=2, timeout=600)
        try:
            assert adopted.pending_preemption is None
            alive = [n for n in adopted.nodes_summary() if n.get("node_ip") == ip and n.get("state") == "ALIVE"]
            assert len(alive) == 1 and alive[0]["node_id"] not in before, alive  # a replacement, not the drained node
            assert not alive[0].get("is_draining"), alive
        finally:
            adopted.stop()  # the adopted state knows the replacement host; the fixture's stop checks nothing is left
