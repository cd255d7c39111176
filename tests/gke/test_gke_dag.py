"""Deferrable create and teardown delete, run by Airflow itself (``dag.test()``, triggers in-process)."""

from __future__ import annotations

from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE

DAG_SOURCE = f'''
from airflow.sdk import DAG
from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator

COMMON = dict(project_id="{PROJECT}", location="{ZONE}", cluster_name="{CLUSTER}", gcp_conn_id="{CONN_ID}",
              deferrable=True, poll_interval=0.05, retry_backoff=0.05)

with DAG("gke_tpu_pool_test", schedule=None) as dag:
    create = GKECreateTPUNodePoolOperator(
        task_id="create_pool", tpu_slice={{"accelerator": "{{{{ params.accelerator }}}}", "topology": "4x4"}},
        capacity="spot", fallback_capacity=["on-demand"], params={{"accelerator": "v6e"}}, **COMMON,
    )
    delete = GKEDeleteNodePoolOperator(task_id="delete_pool", created_by_task_id="create_pool", **COMMON)
    create >> delete.as_teardown(setups=create)
'''


def test_deferrable_create_falls_back_and_teardown_deletes_through_dag_test(gke, dag_file):
    gke.add_fault("stockout", capacity="spot")
    module = dag_file("gke_tpu_pool_dag", DAG_SOURCE)

    run = module.dag.test()

    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "success", states
    assert states == {"create_pool": "success", "delete_pool": "success"}
    create_ti = next(ti for ti in run.get_task_instances() if ti.task_id == "create_pool")
    result = create_ti.xcom_pull(task_ids="create_pool")
    name = result["node_pool_name"]
    assert result["capacity"] == {name: "on-demand"} and result["stockouts"] == ["spot"]
    assert create_ti.xcom_pull(task_ids="create_pool", key="gke_node_pool").endswith(
        f"/kubernetes/nodepool/{ZONE}/{CLUSTER}/{name}?project={PROJECT}"
    )
    # Spot create (failed), delete of the ERROR pool, on-demand create, then the teardown's delete.
    calls = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in gke.requests if r["method"] in ("POST", "DELETE")]
    assert calls == [("POST", "nodePools"), ("DELETE", name), ("POST", "nodePools"), ("DELETE", name)]
    assert gke.node_pools() == []
