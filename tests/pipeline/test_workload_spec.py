"""A team's own code plugged into both pipelines through tpuflow.pipeline.workload.Workload (DAG structure;
no Ray, no Airflow DB): each missing step removes its tasks, the guarantees stay wired around the rest."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.pipeline.factory import KEEP_AFTER_WATCH
from tpuflow.pipeline.workload import Workload

SERVING = {"build_serve_config", "deploy", "smoke_test"}
GKE_SERVING = SERVING | {
    "create_serve_node_pool",
    "request_serve_capacity",
    "delete_service",
    "delete_serve_provisioning_request",
    "delete_serve_node_pool",
}


@pytest.fixture
def acme(tmp_path: Path) -> Path:
    """A user package unlike the demo: a forecast model with its own prep, train loop and Param check."""
    package = tmp_path / "src" / "acme_forecast"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "fit.py").write_text("def loop(config):\n    pass\n")
    (package / "load.py").write_text("")
    (package / "checks.py").write_text(
        "from tpuflow.errors import UserInputError\n\n"
        "def horizon(params):\n"
        "    if params['train_steps'] > 500:\n"
        "        raise UserInputError('params.train_steps', params['train_steps'], 'acme fits in <= 500 steps')\n"
    )
    yield package
    for name in [m for m in sys.modules if m == "acme_forecast" or m.startswith("acme_forecast.")]:
        del sys.modules[name]
    if str(package.parent) in sys.path:
        sys.path.remove(str(package.parent))


def acme_workload(package: Path, **fields: Any) -> Workload:
    spec = {
        "code_dir": package,
        "prep": "acme_forecast.load",
        "train_loop": "acme_forecast.fit:loop",
        "check_params": "acme_forecast.checks:horizon",
    }
    return Workload(**{**spec, **fields})


def setups_of(dag: Any, teardown: str) -> set[str]:
    return {t for t in dag.get_task(teardown).upstream_task_ids if dag.get_task(t).is_setup}


def assert_runs_acme_code(dag: Any, package: Path, *, prep: bool = True) -> None:
    train = dag.get_task("train")
    assert train.train_loop == "acme_forecast.fit:loop"
    assert train.runtime_env == {"py_modules": [str(package)]}  # the package travels with the job
    if prep:
        assert dag.get_task("prep").module == "acme_forecast.load"
        assert dag.get_task("prep").runtime_env == {"py_modules": [str(package)]}
        assert train.datasets == {"train": train.datasets["train"]} and train.datasets["train"].endswith("/data/train")
    else:
        assert train.datasets is None
    # nothing after training but the report: it follows train, and carries no evaluation, answer or endpoint
    report = dag.get_task("write_report")
    assert report.upstream_task_ids == {"train"}
    assert (report.evaluation, report.answer, report.deployed) == (None, None, None)


def test_a_user_workload_builds_the_local_pipeline_without_evaluate_or_serve(acme: Path, tmp_path: Path) -> None:
    from tpuflow.pipeline.factory import build_pipeline_dag

    dag = build_pipeline_dag("acme_local", workload=acme_workload(acme), schedule=None, output_root=str(tmp_path))
    assert set(dag.task_ids) == {
        "check_params",
        "acquire_slice",
        "budget_guard",
        "approve_budget",
        "start_cluster",
        "prep",
        "preflight",
        "train",
        "write_report",
        "stop_cluster",
        "release_slice",
        "chip_ledger",
    }
    assert_runs_acme_code(dag, acme)
    assert {t.task_id for t in dag.tasks if t.is_teardown} == {"stop_cluster", "release_slice", "chip_ledger"}
    assert setups_of(dag, "stop_cluster") == {"check_params", "start_cluster"}
    assert setups_of(dag, "release_slice") == {"check_params", "acquire_slice"}
    assert setups_of(dag, "chip_ledger") == {"check_params", "start_cluster"}
    assert dag.get_task("stop_cluster").upstream_task_ids >= {"write_report"}
    assert dag.get_task("stop_cluster").keep is False  # no endpoint to keep
    assert dag.get_task("prep").upstream_task_ids == {"start_cluster"}
    assert dag.get_task("train").upstream_task_ids == {"start_cluster", "prep", "preflight"}


def test_a_user_workload_builds_the_gke_pipeline_without_evaluate_or_serve(acme: Path, tmp_path: Path) -> None:
    from tpuflow.pipeline.gke import build_gke_pipeline_dag

    gke = {"project_id": "acme-proj-1", "location": "us-east5-b", "cluster_name": "acme", "image": "img"}
    dag = build_gke_pipeline_dag("acme_gke", workload=acme_workload(acme), output_root=str(tmp_path), **gke)
    assert not ({"evaluate"} | GKE_SERVING) & set(dag.task_ids)
    assert_runs_acme_code(dag, acme)
    teardowns = {"delete_ray_cluster", "delete_provisioning_request", "delete_node_pool", "delete_prep_cluster"}
    assert {t.task_id for t in dag.tasks if t.is_teardown} == teardowns | {"chip_ledger", "release_slice"}
    assert setups_of(dag, "delete_node_pool") == {"check_params", "create_node_pool"}
    assert setups_of(dag, "delete_ray_cluster") == {"check_params", "create_ray_cluster"}
    assert setups_of(dag, "delete_provisioning_request") == {"check_params", "request_capacity"}
    assert setups_of(dag, "delete_prep_cluster") == {"check_params", "create_prep_cluster"}
    assert dag.get_task("delete_prep_cluster").upstream_task_ids >= {"write_report"}
    assert dag.get_task("chip_ledger").upstream_task_ids >= {"delete_node_pool", "delete_prep_cluster"}
    # the ledger and the budget count the training slice only: there is no serve slice
    assert [s["role"] for s in dag.get_task("chip_ledger").slices] == ["train"]
    assert [s["role"] for s in dag.get_task("budget_guard").slices] == ["train"]


def test_without_prep_or_evaluate_the_gke_pipeline_starts_no_cpu_cluster(acme: Path, tmp_path: Path) -> None:
    from tpuflow.pipeline.gke import build_gke_pipeline_dag

    gke = {"project_id": "acme-proj-1", "location": "us-east5-b", "cluster_name": "acme", "image": "img"}
    dag = build_gke_pipeline_dag("acme_gke", workload=acme_workload(acme, prep=None), output_root=str(tmp_path), **gke)
    assert not {"prep", "create_prep_cluster", "delete_prep_cluster"} & set(dag.task_ids)
    assert_runs_acme_code(dag, acme, prep=False)
    assert "chip_ledger" in dag.get_task("write_report").downstream_task_ids  # the ledger still comes last
    assert dag.get_task("train").upstream_task_ids >= {"create_ray_cluster", "wait_for_flex_start", "preflight"}


@pytest.mark.parametrize("backend", ["local", "gke"])
def test_a_loop_that_evaluates_in_training_is_gated_and_reported_without_an_evaluate_job(
    acme: Path, tmp_path: Path, backend: str
) -> None:
    """evaluate_in_training: the loop gets prep's held-out set, the train task carries the quality gate on the
    evaluation it reports, the report reads it from train's XCom, and no evaluate job runs (a module named
    for it stays the user's to run on its own)."""
    from tpuflow.pipeline.factory import build_pipeline_dag
    from tpuflow.pipeline.gke import build_gke_pipeline_dag
    from tpuflow.rayjob.quality_gate import gate_failure

    workload = acme_workload(acme, evaluate="acme_forecast.load", evaluate_in_training=True)
    if backend == "local":
        dag = build_pipeline_dag("acme_local", workload=workload, schedule=None, output_root=str(tmp_path))
    else:
        gke = {"project_id": "acme-proj-1", "location": "us-east5-b", "cluster_name": "acme", "image": "img"}
        dag = build_gke_pipeline_dag("acme_gke", workload=workload, output_root=str(tmp_path), **gke)
    assert "evaluate" not in dag.task_ids
    train = dag.get_task("train")
    assert train.train_loop_config["heldout"].endswith("/data/heldout")
    assert train.train_loop_config["heldout"].rsplit("/", 1)[0] == train.datasets["train"].rsplit("/", 1)[0]
    assert train.min_result == {"evaluation.accuracy": "{{ params.accuracy_threshold }}"}
    report = dag.get_task("write_report")
    assert report.evaluation == "{{ ti.xcom_pull(task_ids='train')['evaluation'] }}"
    assert report.upstream_task_ids == {"train"}
    # the gate reads the evaluation the loop reported (the driver's result carries it at its top level)
    assert gate_failure({"evaluation": {"accuracy": 0.95}}, {"evaluation.accuracy": 0.9}) is None
    assert gate_failure({"metrics": {"evaluation": {"accuracy": 0.95}}}, {"evaluation.accuracy": 0.9}) is None
    below = gate_failure({"evaluation": {"accuracy": 0.5}}, {"evaluation.accuracy": 0.9})
    assert below == "quality gate: evaluation.accuracy=0.5 is below the required 0.9; not continuing"
    assert "evaluation.accuracy=None" in gate_failure({"evaluation": None}, {"evaluation.accuracy": 0.9})
    # without evaluate_in_training the same workload runs its evaluate module as a job, gated there
    dag = build_pipeline_dag(
        "acme_job", workload=acme_workload(acme, evaluate="acme_forecast.load"), output_root=str(tmp_path)
    )
    assert "heldout" not in dag.get_task("train").train_loop_config and dag.get_task("train").min_result is None
    assert dag.get_task("evaluate").min_result == {"accuracy": "{{ params.accuracy_threshold }}"}


def test_the_workloads_own_param_check_runs_in_check_params(acme: Path) -> None:
    from tpuflow.pipeline.params import pipeline_params
    from tpuflow.pipeline.steps import CheckParamsOperator

    op = CheckParamsOperator(task_id="check_params", workload=acme_workload(acme))
    params = {name: p.value for name, p in pipeline_params().items()}
    with pytest.raises(UserInputError, match=r"params.train_steps=1500 is invalid: acme fits in <= 500 steps"):
        op.execute({"params": params})
    assert op.execute({"params": {**params, "train_steps": 400}})["topology"] == "4x4"


@pytest.mark.parametrize(
    ("fields", "field", "fix"),
    [
        ({"train_loop": "acme_forecast.fit"}, "workload.train_loop", '"package.module:function"'),
        ({"prep": "acme_forecast/load.py"}, "workload.prep", "dotted module name"),
        ({"check_params": "acme_forecast.checks"}, "workload.check_params", '"package.module:function"'),
        ({"smoke_request": {"q": 1}}, "workload.smoke_request", "give serve_app too"),
        ({"serve_app": "acme_forecast.serve:app", "smoke_request": {"q": 1}}, "workload.smoke_expect", "together"),
        ({"serve_app": "acme_forecast.serve:app", "serve_name": "a/b"}, "workload.serve_name", "letters, digits"),
        ({"evaluate_in_training": "yes"}, "workload.evaluate_in_training", "True or False"),
        (
            {"evaluate_in_training": True, "train_loop_config": {"heldout": "gs://b/mine"}},
            "workload.train_loop_config['heldout']",
            "prep's held-out set",
        ),
    ],
)
def test_a_bad_spec_is_one_line_naming_field_value_and_fix(
    acme: Path, fields: dict[str, Any], field: str, fix: str
) -> None:
    with pytest.raises(UserInputError) as err:
        acme_workload(acme, **fields)
    assert err.value.field == field
    assert "\n" not in str(err.value) and fix in str(err.value) and str(err.value).startswith(f"{field}=")


def test_code_dir_must_be_the_package_folder_that_exists(acme: Path) -> None:
    with pytest.raises(UserInputError, match=r"workload.code_dir='.*missing' is invalid: give an existing folder"):
        acme_workload(acme, code_dir=acme.parent / "missing")
    # the folder above the package: Ray would ship it under its own name, and acme_forecast would not import
    (acme.parent / "__init__.py").write_text("")
    with pytest.raises(UserInputError, match=r"workload.code_dir=.* ship the package folder itself.*acme_forecast"):
        acme_workload(acme, code_dir=acme.parent)
    (acme / "__init__.py").unlink()
    with pytest.raises(UserInputError, match=r"workload.code_dir=.* give a package folder \(add .*__init__.py\)"):
        acme_workload(acme)


def test_gke_serving_of_a_shipped_package_needs_a_uri_the_rayservice_can_fetch(acme: Path) -> None:
    from tpuflow.pipeline.gke import build_gke_pipeline_dag

    workload = acme_workload(acme, serve_app="acme_forecast.serve:app")
    gke = {"project_id": "acme-proj-1", "location": "us-east5-b", "cluster_name": "acme", "image": "img"}
    with pytest.raises(UserInputError, match=r"serve_code_uri=None is invalid: give where the RayService fetches"):
        build_gke_pipeline_dag("acme_gke", workload=workload, **gke)
    dag = build_gke_pipeline_dag("acme_gke", workload=workload, serve_code_uri="gs://b/acme.zip", **gke)
    assert GKE_SERVING - {"smoke_test"} <= set(dag.task_ids) and "smoke_test" not in dag.task_ids
    # without a smoke test the endpoint is kept when the deploy succeeded
    assert dag.get_task("delete_service").keep == KEEP_AFTER_WATCH  # what the idle watch says
    assert "task_ids='deploy'" in dag.get_task("serve_until_idle").keep


def test_both_pipelines_guard_the_endpoint_with_the_serve_token_connection(acme: Path, tmp_path: Path) -> None:
    """serve_token_conn_id reaches the deploy (the app requires the token) and the smoke test (it sends it)."""
    from tpuflow.pipeline.factory import build_pipeline_dag
    from tpuflow.pipeline.gke import build_gke_pipeline_dag

    workload = acme_workload(acme, serve_app="acme_forecast.serve:app", smoke_request={"prompt": "7"}, smoke_expect="8")
    gke = {"project_id": "acme-proj-1", "location": "us-east5-b", "cluster_name": "acme", "image": "img"}
    dags = [
        build_pipeline_dag("acme_local", workload=workload, output_root=str(tmp_path), serve_token_conn_id="acme_tok"),
        build_gke_pipeline_dag(
            "acme_gke", workload=workload, serve_code_uri="gs://b/acme.zip", serve_token_conn_id="acme_tok", **gke
        ),
    ]
    for dag in dags:
        assert dag.get_task("deploy").serve_token_conn_id == "acme_tok"
        assert dag.get_task("smoke_test").serve_token_conn_id == "acme_tok"
    unguarded = build_pipeline_dag("acme_open", workload=workload, output_root=str(tmp_path))
    assert unguarded.get_task("deploy").serve_token_conn_id is None
    assert unguarded.get_task("smoke_test").serve_token_conn_id is None
