"""A team's own Ray task on the training slice, from the same DAG file on either backend (issue 45): the
backend-neutral cluster handle, the task placed inside the slice's lifetime, and its job booked as work on the
slice by the ledger (not as time held idle)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuflow.errors import UserInputError
from tpuflow.pipeline.dag import tpu_pipeline
from tpuflow.pipeline.handles import on_training_slice, training_cluster
from tpuflow.pipeline.workload import Workload
from tpuflow.rayjob.operators import RaySubmitJobOperator


def team_workload(tmp_path: Path) -> Workload:
    package = tmp_path / "acme_sales"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "regress.py").write_text("def fit(config):\n    pass\n")
    return Workload(code_dir=package, train_loop="acme_sales.regress:fit")


@pytest.mark.parametrize(("backend", "start", "teardown"), [
    ("local", "start_cluster", "stop_cluster"),
    ("gke", "create_ray_cluster", "delete_ray_cluster"),
])  # fmt: skip
def test_a_teams_extra_job_runs_on_the_slice_and_is_booked_as_work(
    backend: str, start: str, teardown: str, tmp_path: Path
) -> None:
    dag = tpu_pipeline("acme_sales_forecast", workload=team_workload(tmp_path), backend=backend,
                       output_root=str(tmp_path / "out"))  # fmt: skip
    with dag:
        score = RaySubmitJobOperator(task_id="score", cluster=training_cluster(dag), entrypoint="python -m acme.score")
        on_training_slice(dag, score)
    assert score.cluster.operator.task_id == start
    assert start in score.upstream_task_ids and teardown in score.downstream_task_ids
    ledger = dag.get_task("chip_ledger")
    (train,) = [entry for entry in ledger.slices if entry["role"] == "train"]
    work = ledger._work(train)
    assert work["score"] is None and work["train"] == "training", work  # declared causes kept; the job's own added
    assert "deploy" not in work or work["deploy"] == "serving"


def test_a_dag_not_built_by_tpu_pipeline_has_no_training_cluster() -> None:
    from airflow.sdk import DAG

    with pytest.raises(UserInputError, match=r"^dag=.*tpu_pipeline"):
        training_cluster(DAG("by_hand", schedule=None))
