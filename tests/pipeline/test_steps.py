"""The pipeline's own steps (tpuflow.pipeline.steps) inside a real Airflow run, without Ray.

They replaced ``@task`` functions (to keep TaskFlow out of DAG parsing), so this checks what the
decorator used to give them: Params in the context, XComArgs resolved and Jinja rendered before
execute, dependencies from XComArgs, and the return value as the task's XCom.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DAG_ID = "tpuflow_pipeline_steps_test"
DAG_SOURCE = '''
from typing import Any

from airflow.sdk import DAG, BaseOperator

from tpuflow.pipeline.params import pipeline_params
from tpuflow.pipeline.steps import BuildServeConfigOperator, CheckParamsOperator, WriteReportOperator
from tpuflow.workloads.addition.pipeline import ADDITION


class Emit(BaseOperator):
    """Stands in for the cluster, train, evaluate, smoke test and deploy tasks: returns a fixed XCom."""

    def __init__(self, *, value: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.value = value

    def execute(self, context: Any) -> Any:
        return self.value


with DAG(DAG_ID, schedule=None, params=pipeline_params(), render_template_as_native_obj=True) as dag:
    checked = CheckParamsOperator(task_id="check_params")
    cluster = Emit(task_id="start_cluster", value={"backend": "local", "serve_port": 8123})
    train = Emit(task_id="train", value={"checkpoint": "/ckpt/7"})
    evaluate = Emit(task_id="evaluate", value={"accuracy": 0.97, "n": 100})
    smoke = Emit(task_id="smoke_test", value={"choices": [{"text": "42"}]})
    deploy = Emit(task_id="deploy", value={"serve_url": "http://127.0.0.1:8123"})
    serve_cfg = BuildServeConfigOperator(task_id="build_serve_config", cluster=cluster.output, trained=train.output,
                                         workloads_uri="local://{{ params.framework }}-workloads", workload=ADDITION)
    report = WriteReportOperator(task_id="write_report", output_dir=OUTPUT_DIR + "/{{ dag_run.run_id | length }}",
                                 evaluation=evaluate.output, answer=smoke.output, deployed=deploy.output,
                                 sample_prompt="17+25=", endpoint_path="/addition/v1")
    checked >> cluster
'''


@pytest.fixture
def steps_dag(migrated_airflow_db: Path, tmp_path: Path) -> Iterator[Any]:
    """The DAG above written into the DAGs folder (dag.test() runs DAGs of a bundle) and imported."""
    path = migrated_airflow_db / f"{DAG_ID}.py"
    path.write_text(f"DAG_ID = {DAG_ID!r}\nOUTPUT_DIR = {str(tmp_path / 'out')!r}\n" + DAG_SOURCE)
    sys.path.insert(0, str(migrated_airflow_db))
    try:
        __import__(DAG_ID)
    finally:
        sys.path.remove(str(migrated_airflow_db))
    yield sys.modules[DAG_ID].dag
    sys.modules.pop(DAG_ID, None)
    path.unlink(missing_ok=True)


def test_steps_are_wired_from_their_xcom_arguments(steps_dag: Any) -> None:
    assert steps_dag.get_task("build_serve_config").upstream_task_ids == {"start_cluster", "train"}
    assert steps_dag.get_task("write_report").upstream_task_ids == {"evaluate", "smoke_test", "deploy"}


def test_steps_run_with_rendered_arguments(steps_dag: Any, tmp_path: Path) -> None:
    run = steps_dag.test(run_conf={"framework": "torch", "topology": "2x4"})
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert run.state == "success", {t: ti.state for t, ti in tis.items()}

    checked = tis["check_params"].xcom_pull(task_ids="check_params")
    assert checked["topology"] == "2x4" and checked["num_hosts"] == 1

    config = tis["build_serve_config"].xcom_pull(task_ids="build_serve_config")
    (app,) = config["applications"]
    assert app["args"] == {"checkpoint": "/ckpt/7", "framework": "torch", "model_name": "addition"}
    assert app["runtime_env"] == {"working_dir": "local://torch-workloads"}
    assert config["http_options"]["port"] == 8123

    report = tis["write_report"].xcom_pull(task_ids="write_report")
    assert report["output_dir"] == str(tmp_path / "out" / str(len(run.run_id)))
    assert report["accuracy"] == 0.97 and report["sample_completion"] == "42"
    assert report["endpoint"] == "http://127.0.0.1:8123/addition/v1"
    assert json.loads((Path(report["output_dir"]) / "report.json").read_text()) == report


def test_bad_params_fail_the_check_task(steps_dag: Any) -> None:
    run = steps_dag.test(run_conf={"accelerator": "TPU-V5P", "topology": "4x4"})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["check_params"] == "failed"
    assert states["start_cluster"] == "upstream_failed"


def test_step_arguments_are_checked_when_parsed_if_plain_and_once_rendered_if_templated() -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.errors import UserInputError
    from tpuflow.pipeline.steps import BuildServeConfigOperator, WriteReportOperator

    with pytest.raises(UserInputError) as err:
        BuildServeConfigOperator(
            task_id="build", cluster={"backend": "local"}, trained={}, workloads_uri="local://w", workload=ADDITION
        )
    assert err.value.field == "trained"
    op = BuildServeConfigOperator(
        task_id="build",
        cluster={"backend": "local"},
        trained="{{ params.trained }}",
        workloads_uri="local://w",
        workload=ADDITION,
    )
    op.render_template_fields({"params": {"trained": "/ckpt/7"}})
    with pytest.raises(UserInputError) as err:
        op.execute({"params": {"framework": "jax"}})
    assert err.value.field == "trained"

    report = WriteReportOperator(
        task_id="report", output_dir="{{ params.out }}", evaluation={}, answer={}, deployed={"serve_url": "http://x"}
    )
    report.render_template_fields({"params": {"out": ""}})
    with pytest.raises(UserInputError) as err:
        report.execute({})
    assert err.value.field == "output_dir"
