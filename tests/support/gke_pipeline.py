"""`tpu_llm_pipeline_gke` on the GKE and Kubernetes stand-ins through dag.test(): configuration, the shipped
DAG file, task states, and what the stand-ins still hold (tests/pipeline, tests/faults)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
from tpuflow_rehearsal.standins.kuberay_controller import KubeRayStandin
from tpuflow_rehearsal.standins.kubernetes_api import PODS, RAYCLUSTERS, RAYSERVICES

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "tpu_llm_pipeline_gke"
PROJECT, ZONE, CLUSTER = "tpu-proj-123", "us-east5-b", "tpu-cluster"
CLUSTER_PATH = f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}"


@contextmanager
def gke_standin(operation_seconds: float = 0.2) -> Iterator[GKEApiStandin]:
    """The GKE stand-in with only the pipeline's cluster."""
    with GKEApiStandin(operation_seconds=operation_seconds, clusters=[CLUSTER_PATH]) as standin:
        yield standin


@contextmanager
def dag_in_folder(dags_folder: Path) -> Iterator[Path]:
    """The session's DAGs folder with the shipped DAG file in it (dag.test() runs DAGs of a bundle).

    tests/conftest.py links dags/*.py there; another conftest may have chosen a DAGs folder without them."""
    path = dags_folder / f"{DAG_ID}.py"
    linked = not path.exists()
    if linked:
        path.symlink_to(REPO / "dags" / f"{DAG_ID}.py")
    try:
        yield dags_folder
    finally:
        if linked:
            path.unlink(missing_ok=True)


def point_airflow_at(
    monkeypatch: pytest.MonkeyPatch, gke: GKEApiStandin, kube: KubeRayStandin, outputs: Path | str
) -> None:
    """Configuration only: connections to the stand-ins and the Variables the DAG reads."""
    monkeypatch.setenv("AIRFLOW_CONN_GKE_STANDIN", json.dumps(gke.airflow_connection(PROJECT)))
    for key, value in kube.connection_env("kube_standin").items():
        monkeypatch.setenv(key, value)
    variables = {
        "tpuflow_gcp_conn_id": "gke_standin",  # the project comes from this connection's extra
        "tpuflow_kubernetes_conn_id": "kube_standin",
        "tpuflow_gke_location": ZONE,
        "tpuflow_gke_cluster": CLUSTER,
        # The stand-in's Ray clusters run here, not in the image: Serve finds workloads/ in the repo.
        "tpuflow_serve_workloads_uri": f"local://{REPO / 'workloads'}",
        "tpuflow_gke_output_root": str(outputs),
    }
    for name, value in variables.items():
        monkeypatch.setenv(f"AIRFLOW_VAR_{name.upper()}", value)


def load_dag(dags_folder: Path, *, poll: float) -> Any:
    """The shipped DAG file, parsed from the DAGs folder, with test-sized polling (the waits are unchanged)."""
    return load_dag_file(dags_folder / f"{DAG_ID}.py", DAG_ID, poll=poll)


def load_dag_file(path: Path, dag_id: str, *, poll: float) -> Any:
    """DAG ``dag_id`` of the file at ``path``, parsed as the DAG processor does, with test-sized polling."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(path))
    assert bag.import_errors == {}, bag.import_errors
    dag = bag.get_dag(dag_id)
    for op in dag.tasks:
        for attr in ("poll_interval", "retry_backoff"):
            if hasattr(op, attr):
                setattr(op, attr, poll)
    return dag


def task_states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def wait_until_empty(gke: GKEApiStandin, kube: KubeRayStandin, timeout: float = 180.0) -> None:
    """The RayService's own RayCluster is garbage-collected (its Ray processes stopped) after the RayService."""
    deadline = time.time() + timeout
    while time.time() < deadline and (
        gke.node_pools() or kube.store.list(RAYCLUSTERS) or kube.store.list(RAYSERVICES) or kube.store.list(PODS)
    ):
        time.sleep(0.5)
