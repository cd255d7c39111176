"""Backend-neutral handles on a ``tpu_pipeline`` DAG's training slice, for a team's own extra tasks.

    dag = tpu_pipeline("acme_forecast", workload=forecast)
    with dag:
        score = RaySubmitJobOperator(task_id="score", cluster=training_cluster(dag), entrypoint="python -m acme.score")
        on_training_slice(dag, score)

The training slice's Ray cluster is the XCom of ``start_cluster`` locally and of ``create_ray_cluster`` on GKE;
``training_cluster`` names whichever the DAG has, so the same file runs on both backends. ``on_training_slice``
runs the tasks after the cluster is up and before its teardown (without it, the teardown need not wait for
them), and the ledger books their Ray jobs on the slice as work ("other Ray jobs"), not as time held idle: every
task whose ``cluster`` is this handle is, whether or not it was passed here.

Cheap to import (DAG files use it): no Airflow import at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuflow.errors import UserInputError

if TYPE_CHECKING:
    from airflow.sdk import DAG, BaseOperator

# the task whose XCom is the training slice's Ray cluster -> the teardown that deletes it, per backend
_CLUSTER_TEARDOWN = {"start_cluster": "stop_cluster", "create_ray_cluster": "delete_ray_cluster"}


def training_cluster_task_id(dag: DAG) -> str:
    """The id of the task whose XCom is the training slice's Ray cluster; one line when ``dag`` has none."""
    for task_id in _CLUSTER_TEARDOWN:
        if task_id in dag.task_dict:
            return task_id
    raise UserInputError("dag", getattr(dag, "dag_id", dag), "give a DAG built with tpuflow.pipeline.dag.tpu_pipeline")


def training_cluster(dag: DAG) -> Any:
    """The training slice's Ray cluster (an XComArg), as a Ray operator's ``cluster`` argument on either backend."""
    return dag.task_dict[training_cluster_task_id(dag)].output


def on_training_slice(dag: DAG, *tasks: BaseOperator) -> None:
    """Run ``tasks`` while the training slice is up: after its cluster is ready, before its teardown."""
    start = training_cluster_task_id(dag)
    teardown = dag.task_dict[_CLUSTER_TEARDOWN[start]]
    for task in tasks:
        dag.task_dict[start] >> task >> teardown
