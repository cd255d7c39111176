"""`tpuflow demo --backend gke` as a user runs it: the GKE and Kubernetes stand-ins, tpu_llm_pipeline_gke end to end
through `airflow dags test`, the chip-hour ledger printed, and nothing left behind: the demo's own leftover check
(node pools, workload policies, Kubernetes objects, Ray processes, slice leases) passes and no process of the run
outlives the command. The run takes about 5 to 9 minutes on 2 cores: make test-long. make test checks that the leftover
check names each kind of thing a run can leave."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TPUFLOW = str(Path(sys.executable).with_name("tpuflow"))  # .venv/bin/tpuflow
DATE = "2026-11-03"
DAG_ID = "tpu_llm_pipeline_gke"
DEMO_TIMEOUT_S = 1500.0


def processes_naming(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process (but this one) whose command line or environment names ``marker``:
    the demo's Airflow, stand-in and Ray processes all carry the work dir (AIRFLOW_HOME, KUBECONFIG,
    RAY_AUTH_TOKEN_PATH, ...)."""
    found, want = [], marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie holds nothing
            named = want in cmdline or want in (entry / "environ").read_bytes()
        except (OSError, IndexError):
            continue  # gone, or not ours to read
        if named:
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")[:300]))
    return found


def run_demo_gke(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command in its own session; stopped as Ctrl-C would (SIGTERM, then SIGKILL) if it overruns."""
    env = {**os.environ, "TPUFLOW_HOME": str(work / "home")}
    env.pop("TPUFLOW_SLICE_LEASES", None)  # the leases live under TPUFLOW_HOME
    cmd = [TPUFLOW, "demo", "--backend", "gke", "--work-dir", str(work), "--date", DATE, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=DEMO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the demo stops its stand-ins and their Ray clusters
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(f"tpuflow demo --backend gke ran past {DEMO_TIMEOUT_S:.0f}s\n{stdout[-5000:]}\n{stderr[-5000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.fixture
def no_process_left(tmp_path: Path):
    """After the test: no process names the run's folder. One that does is killed (a shared machine), then the
    test fails naming it."""
    yield
    deadline = time.monotonic() + 30  # a process signalled at the very end may take a moment to exit
    while (left := processes_naming(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(1)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert left == [], f"processes of the demo outlived it: {left}"


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_demo_gke_runs_the_pipeline_prints_the_ledger_and_leaves_nothing(tmp_path: Path, no_process_left) -> None:
    started = time.time()
    out = run_demo_gke(tmp_path, "--topology", "2x2", "--num-train", "5000", "--control-plane", "imitation")
    print(f"tpuflow demo --backend gke --control-plane imitation: {time.time() - started:.0f}s")
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-6000:]
    assert "=== tpuflow demo --backend gke: pipeline succeeded in" in out.stdout
    # the ledger, printed: one line of JSON with the run's chip-hours per slice
    (ledger_line,) = [line for line in out.stdout.splitlines() if line.startswith("ledger:")]
    printed = json.loads(ledger_line.removeprefix("ledger:"))
    assert printed["chip_hours"] > 0 and printed["open"] is False
    assert [s["role"] for s in printed["slices"]] == ["train", "serve"]
    # report.json holds the same ledger
    report = json.loads((tmp_path / "gke" / "outputs" / DAG_ID / DATE / "report.json").read_text())
    assert report["ledger"] == printed
    assert report["accuracy"] >= 0.9
    # the demo's own check found nothing left, and said what it looked at
    assert "left behind after the run" not in out.stderr, out.stderr[-3000:]
    (left_line,) = [line for line in out.stdout.splitlines() if line.startswith("left behind:")]
    assert left_line.split(":", 1)[1].strip().startswith("nothing (node pools, workload policies,"), left_line
    assert "slice leases" in left_line and "Ray processes" in left_line and "ProvisioningRequests" in left_line
    assert not list((tmp_path / "home" / "slice-leases").glob("slot-*.json"))
    assert processes_naming(str(tmp_path)) == []


@pytest.mark.slow
@pytest.mark.long  # the whole GKE DAG with serving (6-9 min on 2 cores); make test runs a team's GKE DAG on the real
# control plane (tests/pipeline/test_team_dag_gke_killed.py) and a multi-host RayService (tests/rehearsal/test_rehearsal.py)
@pytest.mark.timeout(1800)
@pytest.mark.skipif(os.geteuid() != 0, reason="the node agent makes network namespaces: root only")
def test_demo_gke_on_the_real_control_plane_leaves_nothing(tmp_path: Path, no_process_left) -> None:
    """The default `tpuflow demo --backend gke`: tpu_llm_pipeline_gke on real etcd, kube-apiserver, scheduler,
    controller-manager and KubeRay operator, the node agent running every pod: prep, preflight, training,
    evaluation, the RayService and its smoke test, the teardowns, and nothing left (the README's quick run)."""
    started = time.time()
    out = run_demo_gke(tmp_path, "--topology", "2x2", "--num-train", "5000")
    print(f"tpuflow demo --backend gke (real control plane): {time.time() - started:.0f}s")
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-6000:]
    assert "starting the real control plane" in out.stdout
    assert "=== tpuflow demo --backend gke: pipeline succeeded in" in out.stdout
    (pods_line,) = [line for line in out.stdout.splitlines() if line.startswith("pods run:")]
    heads = int(pods_line.split("(", 1)[1].split()[0])
    assert heads >= 3, pods_line  # prep cluster, training slice, the RayService's cluster (a head may be remade)
    report = json.loads((tmp_path / "gke" / "outputs" / DAG_ID / DATE / "report.json").read_text())
    assert report["accuracy"] >= 0.9 and [s["role"] for s in report["ledger"]["slices"]] == ["train", "serve"]
    (left_line,) = [line for line in out.stdout.splitlines() if line.startswith("left behind:")]
    assert left_line.split(":", 1)[1].strip().startswith("nothing ("), left_line
    assert not [
        n
        for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        if n.startswith("tpf")
    ]


def test_the_leftover_check_names_each_kind_of_leftover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-ins with the fake launcher (no Ray): a node pool, a workload policy, a RayCluster (and its pod),
    a slice lease taken during the run and a live process of a launched cluster are each named; a lease held
    before the run is not the run's."""
    from types import SimpleNamespace

    from tpuflow.local.cluster import NodeProcess
    from tpuflow.pipeline.gke import prep_cluster_manifest
    from tpuflow.slices.leases import lease_store
    from tpuflow_rehearsal.demo_gke import held_leases, leftovers, ray_process_leftovers
    from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS
    from tpuflow_rehearsal.standins.stack import StandinStack

    monkeypatch.setenv("TPUFLOW_SLICE_LEASES", str(tmp_path / "leases"))
    leases = lease_store(None)
    leases.try_acquire("other_dag/manual__before", 16)
    with StandinStack(tmp_path / "standins", fake=True, operation_seconds=0) as stack:
        before = held_leases()
        assert leftovers(stack, [], before) == []
        pool = {"name": "left-pool", "config": {"machineType": "ct6e-standard-1t"}, "initialNodeCount": 1}
        stack.gke.create_node_pool(stack.project, stack.zone, stack.cluster, {"nodePool": pool})
        policy = {"name": "left-policy", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}}
        stack.gke.compute.insert(stack.project, stack.region, policy)
        manifest = prep_cluster_manifest("rayproject/ray:2.60.0-py311", {})
        stack.kube.store.create(RAYCLUSTERS, "default", {**manifest, "metadata": {"name": "left-rc"}})
        leases.try_acquire(f"{DAG_ID}/manual__{DATE}", 16)
        sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
        cluster = SimpleNamespace(name="left-ray", nodes=[NodeProcess("head", sleeper.pid, "")], temp_dir=str(tmp_path))
        try:
            left = leftovers(stack, [cluster], before)  # type: ignore[list-item]
        finally:
            sleeper.kill()
            sleeper.wait()
    for item in ("node pool left-pool", "workload policy left-policy", "RayCluster left-rc",
                 f"slice lease slot 1 ({DAG_ID}/manual__{DATE})", f"Ray cluster left-ray processes [{sleeper.pid}]"):  # fmt: skip
        assert item in left, (item, left)
    assert not any("other_dag" in item for item in left), left
    assert ray_process_leftovers([cluster]) == []  # type: ignore[list-item]
