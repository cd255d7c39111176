"""The KubeRay operators inside a real Airflow run (dag.test: task runner, XCom, inline triggerer) against
the imitation's Kubernetes API and simulated KubeRay over a kubernetes connection from AIRFLOW_CONN_KUBE_STANDIN
(kube_config_path). The same operators on the real control plane: test_dag_real_plane.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support.standin_dag_run import run_dagtest, standin_airflow_home

from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller import FakeServeBehaviour, KubeRayStandin, StaticNodePools
from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS, RAYSERVICES

REPO = Path(__file__).resolve().parents[2]

DAG = textwrap.dedent("""
    from airflow.sdk import DAG
    from tpuflow.kuberay.operators import (
        KubeRayCreateClusterOperator, KubeRayDeleteClusterOperator, KubeRayDeleteServiceOperator,
        KubeRayDeployServiceOperator)
    from tpuflow.tpu import TpuSlice

    SLICE = TpuSlice.from_spec("v6e", "4x4")
    COMMON = dict(kubernetes_conn_id="kube_standin", deferrable=True, poll_interval=0.2)
    SERVE = {"applications": [{"name": "llm", "import_path": "workloads.serve:app",
                               "args": SLICE.serve_accelerator_config(), "deployments": [{"name": "LLMServer"}]}]}

    with DAG("kuberay_standin_smoke", schedule=None) as dag:
        create = KubeRayCreateClusterOperator(task_id="ray_cluster", tpu_slice=SLICE, image="rayproject/ray:2.60.0-py311",
                                              wait_timeout=60, **COMMON)
        delete = KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="ray_cluster",
                                              wait_timeout=60, **COMMON)
        create >> delete.as_teardown(setups=create)
        serve = KubeRayDeployServiceOperator(task_id="serve", tpu_slice=SLICE, image="rayproject/ray:2.60.0-py311",
                                             serve_config=SERVE, wait_timeout=3, **COMMON)
        # trigger_rule all_done, not as_teardown(setups=serve): a setup that fails (deadline) skips its
        # teardown, and the RayService it created would keep its TPU slice.
        delete_serve = KubeRayDeleteServiceOperator(task_id="delete_serve", service_task_id="serve",
                                                    wait_timeout=60, trigger_rule="all_done", **COMMON)
        delete >> serve >> delete_serve
""")


@pytest.mark.slow
def test_operators_in_a_dag_run(tmp_path: Path) -> None:
    tpu = TpuSlice.from_spec("v6e", "4x4")
    from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher

    launcher = FakeRayLauncher(
        serve={
            "llm": FakeServeBehaviour(
                app_status="DEPLOYING",
                deployment_message="Deployment 'LLMServer' has 1 replicas that have taken more than "
                "30s to be scheduled. Resources required for each replica: {'TPU': 4.0}",
            )
        }
    )
    # One slice worth of nodes: the service's cluster can only start after the first cluster is deleted.
    with KubeRayStandin(
        tmp_path / "kube", launcher=launcher, node_pools=StaticNodePools([(tpu.node_selector, 4)]), interval=0.1
    ) as kube:
        dag_file, env = standin_airflow_home(
            tmp_path / "airflow", kube.connection_env("kube_standin"), "kuberay_standin_smoke", DAG
        )
        result, output = run_dagtest(dag_file, "kuberay_standin_smoke", env)
        states = result["states"]
        assert states == {
            "ray_cluster": "success",
            "delete_ray_cluster": "success",
            "serve": "failed",
            "delete_serve": "success",
        }, output[-5000:]
        payload = result["xcoms"]["ray_cluster.return_value"]
        assert payload["dashboard_url"].startswith("http://127.0.0.1:") and payload["slice"]["num_hosts"] == 4
        assert result["xcoms"]["ray_cluster.ray_dashboard"] == payload["dashboard_url"]
        assert result["xcoms"]["delete_ray_cluster.return_value"]["deleted"] is True
        # The stuck RayService ended the task at its 3 s deadline, naming the deployment and the likely cause.
        assert "deployment 'LLMServer' of application 'llm' is UPDATING" in output
        assert "accelerator_config" in output
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []


TEARDOWN_DAG = textwrap.dedent("""
    from datetime import timedelta

    from airflow.sdk import DAG
    from tpuflow.kuberay.operators import KubeRayCreateClusterOperator, KubeRayDeleteClusterOperator
    from tpuflow.tpu import TpuSlice

    COMMON = dict(kubernetes_conn_id="kube_standin", deferrable=True, poll_interval=0.2)

    with DAG("team_failed_setup", schedule=None) as dag:
        create = KubeRayCreateClusterOperator(task_id="ray", tpu_slice=TpuSlice.from_spec("v6e", "2x2"),
                                              image="rayproject/ray:2.60.0-py311", wait_timeout=3, retries=1,
                                              retry_delay=timedelta(seconds=1), **COMMON)
        delete = KubeRayDeleteClusterOperator(task_id="drop_ray", cluster_task_id="ray", wait_timeout=60, **COMMON)
        create >> delete.as_teardown(setups=create)
""")


@pytest.mark.slow
@pytest.mark.long  # on the imitation; make test runs it on the real control plane (test_dag_real_plane.py)
def test_a_create_that_failed_for_good_deletes_its_cluster_though_airflow_skips_its_teardown(tmp_path: Path) -> None:
    """A team's natural DAG: ``delete.as_teardown(setups=create)``. Airflow skips that teardown when its setup
    failed, so the create (never ready: no TPU node) deletes its own RayCluster once its last try failed; the
    retry before that adopted it (one RayCluster, made once)."""
    from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher

    with KubeRayStandin(
        tmp_path / "kube", launcher=FakeRayLauncher(), node_pools=StaticNodePools([]), interval=0.1
    ) as kube:
        dag_file, env = standin_airflow_home(
            tmp_path / "airflow", kube.connection_env("kube_standin"), "team_failed_setup", TEARDOWN_DAG
        )
        result, output = run_dagtest(dag_file, "team_failed_setup", env)
        states = result["states"]
        assert states["ray"] == "failed" and states["drop_ray"] != "success", states  # Airflow skipped it
        assert kube.store.list(RAYCLUSTERS) == [], output[-5000:]
        created = [e for _, e, _ in kube.store.events_since(RAYCLUSTERS, None, 0) or [] if e == "ADDED"]
        assert len(created) == 1, created  # the retry adopted the first try's RayCluster
        assert "Task failed: deleting the RayCluster" in output, output[-5000:]
