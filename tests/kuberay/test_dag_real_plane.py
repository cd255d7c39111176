"""The KubeRay operators inside a team's Airflow run (`airflow dags test` in a subprocess: task runner, XCom, the
inline triggerer) against the real control plane: real etcd, kube-apiserver, scheduler, controller-manager and
the KubeRay operator (tpuflow_rehearsal.rehearsal), only GKE's API and nodes played. The imitation's versions of these
runs are in test_dag_standin.py (its stuck-RayService message is a behaviour only the imitation can be told to
play)."""

from __future__ import annotations

import collections
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.standin_dag_run import run_dagtest, standin_airflow_home

from tpuflow_rehearsal.nodes import network as net
from tpuflow_rehearsal.rehearsal import RehearsalStack

pytestmark = [pytest.mark.slow, pytest.mark.skipif(net.available() is not None, reason=str(net.available()))]

REPO = Path(__file__).resolve().parents[2]
POOL = "acme-v6e-2x2"

# Two chains, as a team writes them: a RayCluster on the team's one-host v6e 2x2 pool, deleted by its teardown;
# a RayCluster for a v6e 2x4 slice (one 8-chip host) no node pool has: its worker stays Pending; retried once,
# then failed for good.
DAG = textwrap.dedent("""
    from datetime import timedelta

    from airflow.sdk import DAG
    from tpuflow.kuberay.operators import KubeRayCreateClusterOperator, KubeRayDeleteClusterOperator
    from tpuflow.tpu import TpuSlice

    COMMON = dict(kubernetes_conn_id="acme_gke", deferrable=True, poll_interval=1, image="rayproject/ray:2.60.0-py311")

    with DAG("acme_ray_on_gke", schedule=None) as dag:
        ray = KubeRayCreateClusterOperator(task_id="ray", tpu_slice=TpuSlice.from_spec("v6e", "2x2"),
                                           wait_timeout=300, **COMMON)
        drop = KubeRayDeleteClusterOperator(task_id="drop_ray", cluster_task_id="ray", wait_timeout=120,
                                            kubernetes_conn_id="acme_gke", poll_interval=1)
        ray >> drop.as_teardown(setups=ray)
        big = KubeRayCreateClusterOperator(task_id="big_ray", tpu_slice=TpuSlice.from_spec("v6e", "2x4"),
                                           wait_timeout=8, retries=1, retry_delay=timedelta(seconds=1), **COMMON)
        drop_big = KubeRayDeleteClusterOperator(task_id="drop_big_ray", cluster_task_id="big_ray", wait_timeout=120,
                                                kubernetes_conn_id="acme_gke", poll_interval=1)
        big >> drop_big.as_teardown(setups=big)
""")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RehearsalStack]:
    with RehearsalStack(tmp_path_factory.mktemp("rehearsal"), operation_seconds=0) as running:
        yield running


def _until(what: str, ok: Callable[[], object], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def test_a_teams_kuberay_dag_on_the_real_operator(stack: RehearsalStack, tmp_path: Path) -> None:
    """The cluster on the pool is ready by the real operator's word and its teardown deletes it; the cluster no
    node can hold fails at its deadline naming the real scheduler's reason, its retry adopts the same RayCluster
    (one uid), and once no try is left it deletes it itself, since Airflow skips a teardown whose setup failed."""
    api = stack.api()
    pool = {"name": POOL, "initialNodeCount": 1, "config": {"machineType": "ct6e-standard-4t"}}
    stack.gke.create_node_pool(stack.project, stack.zone, stack.cluster, {"nodePool": pool})
    _until("the pool's node", lambda: [n for n in api.items("/api/v1/nodes") if POOL in n["metadata"]["name"]])
    _until("the default service account", lambda: api.items("/api/v1/namespaces/default/serviceaccounts"))

    uids: dict[str, set[str]] = collections.defaultdict(set)  # RayCluster name -> every uid it had
    states: dict[str, set[str]] = collections.defaultdict(set)  # RayCluster name -> the real operator's states
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            try:
                for obj in api.items("/apis/ray.io/v1/rayclusters"):
                    uids[obj["metadata"]["name"]].add(obj["metadata"]["uid"])
                    states[obj["metadata"]["name"]].add((obj.get("status") or {}).get("state") or "")
            except OSError:
                continue

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        dag_file, env = standin_airflow_home(
            tmp_path / "airflow", stack.kubernetes_connection_env("acme_gke"), "acme_ray_on_gke", DAG
        )
        result, output = run_dagtest(dag_file, "acme_ray_on_gke", env, timeout=900)
    finally:
        done.set()
        watcher.join(10)
    (tmp_path / "dagtest.log").write_text(output)  # the whole run's log, kept with the test's folder
    task_states = result["states"]
    assert task_states["ray"] == "success" and task_states["drop_ray"] == "success", task_states
    assert task_states["big_ray"] == "failed" and task_states["drop_big_ray"] != "success", task_states

    payload = result["xcoms"]["ray.return_value"]
    assert payload["slice"]["num_hosts"] == 1 and payload["dashboard_url"].endswith(":8265"), payload
    assert result["xcoms"]["drop_ray.return_value"]["deleted"] is True
    assert "ready" in states[payload["name"]], dict(states)
    # the deadline's reasons are the real scheduler's and kubelet-side words, as tpuflow.kuberay.status reads them
    assert "not ready by the deadline" in output and "0/1 worker pods ready" in output, output[-5000:]
    assert "is Pending (Unschedulable" in output, output[-5000:]
    assert "FailedScheduling" in output and "didn't match Pod's node affinity/selector" in output, output[-5000:]
    assert "Task failed: deleting the RayCluster" in output, output[-5000:]
    big = [name for name in uids if name != payload["name"]]
    assert len(big) == 1 and len(uids[big[0]]) == 1, dict(uids)  # the retry adopted the first try's RayCluster
    assert states[big[0]] <= {"", "suspended", "unknown"} and "ready" not in states[big[0]], dict(states)

    assert api.items("/apis/ray.io/v1/rayclusters") == []
    _until("every Ray pod gone", lambda: not api.items("/api/v1/pods", labelSelector="ray.io/cluster"))
    stack.gke.delete_node_pool(stack.project, stack.zone, stack.cluster, POOL)
    _until("nothing left", lambda: not stack.leftovers())
