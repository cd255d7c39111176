"""Reports and forms that fit the workload (issue 45): a team's DAG has no Params of the steps its workload lacks
(on both backends), every task still renders against the DAG's own default Params, and its report.json has no keys
of those steps; the shipped DAGs keep every Param and the demo's report keeps every key (DAG structure and
rendering only; no Ray, no Airflow services)."""

from __future__ import annotations

import json
import runpy
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.python_packages import acme_sales

from tpuflow.pipeline.dag import tpu_pipeline
from tpuflow.pipeline.workload import Workload

REPO = Path(__file__).resolve().parents[2]
RUN_DATE = datetime(2026, 11, 3, tzinfo=UTC)
TRAINED = {"run_name": "jax-tpu-v6e-4x4", "checkpoint": "/ckpt/3", "resumed_from": None, "steps_trained": 1500}

# The Params only a step a workload may lack reads (tpuflow.pipeline.params.STEP_PARAMS).
PREP_PARAMS = {"num_train", "num_eval"}
EVALUATION_PARAMS = {"accuracy_threshold"}
SERVING_PARAMS = {"serve_topology", "keep_endpoint", "idle_timeout"}
# The shipped DAGs' trigger form (tests/airflow_services/test_real_airflow.py's trigger-form test), and GKE's own.
SHIPPED_PARAMS = {
    "accelerator",
    "topology",
    "machine_type",
    "num_slices",
    "preflight",
    "framework",
    "train_steps",
    "checkpoint_every",
    "accuracy_threshold",
    "keep_endpoint",
    "idle_timeout",
    "num_train",
    "num_eval",
    "max_chip_hours",
    "over_budget",
    "serve_topology",
    "resume",
}
GKE_PARAMS = {"max_run_duration_seconds", "zones", "zone_failover"}
# report.json's keys: always, and of each step (tpuflow.pipeline.steps.write_report)
ALWAYS_KEYS = ["output_dir", "training"]
EVALUATION_KEYS = ["accuracy", "heldout_examples", "eval_examples_per_s", "eval_hosts"]
SMOKE_KEYS = ["sample_prompt", "sample_completion"]
DEMO_REPORT_KEYS = ["output_dir", *EVALUATION_KEYS, *SMOKE_KEYS, "endpoint", "training"]


@pytest.fixture
def prep_and_train(tmp_path: Path) -> Workload:
    """Only prep and a train loop: no evaluate, no serve_app."""
    return Workload(
        code_dir=acme_sales(tmp_path), prep="acme_sales.build_features", train_loop="acme_sales.regress:fit"
    )


def build(workload: Workload, tmp_path: Path, backend: str, dag_id: str = "acme_sales_forecast") -> Any:
    return tpu_pipeline(dag_id, workload=workload, backend=backend, output_root=str(tmp_path / "out"))


# --- rendering every task against the DAG's default Params -------------------------------------------------
class _Anything(dict):
    """An upstream XCom of any shape: every key (and .get) is another one, so only the Params can be missing."""

    def __missing__(self, key: Any) -> _Anything:
        return _Anything()

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key]


class _TaskInstance:
    def __init__(self, xcoms: dict[str, Any] | None = None) -> None:
        self.xcoms = xcoms or {}

    def xcom_pull(self, task_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        return self.xcoms.get(task_ids, _Anything()) if isinstance(task_ids, str) else _Anything()


def run_context(dag: Any, task: Any, params: dict[str, Any], ti: _TaskInstance | None = None) -> dict[str, Any]:
    """What a task of a manual run is rendered with: the run's Params, its DAG run, XComs, Variables, connections."""
    ti = ti or _TaskInstance()
    return {
        "params": params,
        "ti": ti,
        "task_instance": ti,
        "dag_run": SimpleNamespace(logical_date=RUN_DATE, run_after=RUN_DATE, conf={}, run_id="manual__acme"),
        "run_id": "manual__acme",
        "logical_date": RUN_DATE,
        "ds": RUN_DATE.strftime("%Y-%m-%d"),
        "var": {"value": {}, "json": {}},  # every Variable unset: the templates' own defaults
        "conn": {},
        "dag": dag,
        "task": task,
    }


def default_params(dag: Any) -> dict[str, Any]:
    return {name: dag.params[name] for name in dag.params}


def render_failures(dag: Any, params: dict[str, Any]) -> dict[str, str]:
    """Each task whose templated fields fail to render (the DAG's Jinja: StrictUndefined), with the error."""
    failures = {}
    for task in dag.tasks:
        try:
            task.render_template_fields(run_context(dag, task, params))
        except Exception as err:  # noqa: BLE001 - any failure to render is the finding
            failures[task.task_id] = f"{type(err).__name__}: {err}"
    return failures


@pytest.mark.parametrize("backend", ["local", "gke"])
def test_a_workload_without_evaluate_or_serving_has_no_params_of_them(
    prep_and_train: Workload, tmp_path: Path, backend: str
) -> None:
    dag = build(prep_and_train, tmp_path, backend)
    assert not {"evaluate", "deploy", "smoke_test", "serve_until_idle"} & set(dag.task_ids)
    assert not (EVALUATION_PARAMS | SERVING_PARAMS) & set(dag.params), sorted(dag.params)
    expected = SHIPPED_PARAMS - EVALUATION_PARAMS - SERVING_PARAMS | (GKE_PARAMS if backend == "gke" else set())
    assert set(dag.params) == expected  # prep's Params stay: the workload has prep
    # and without prep, prep's Params go too
    no_prep = build(Workload(code_dir=prep_and_train.code_dir, train_loop="acme_sales.regress:fit"), tmp_path, backend)
    assert set(dag.params) - set(no_prep.params) == PREP_PARAMS


@pytest.mark.parametrize("backend", ["local", "gke"])
def test_every_task_renders_against_the_dags_own_default_params(
    prep_and_train: Workload, tmp_path: Path, backend: str
) -> None:
    """No template reads a Param the DAG left out: with only the DAG's Params (strict Jinja), every task renders."""
    dag = build(prep_and_train, tmp_path, backend)
    assert render_failures(dag, default_params(dag)) == {}
    # the rendering can fail: the shipped workload's DAG without one of its serving Params does
    from tpuflow.workloads.addition.pipeline import ADDITION

    shipped = build(ADDITION, tmp_path, backend, dag_id="shipped")
    params = default_params(shipped)
    del params["keep_endpoint"]
    failures = render_failures(shipped, params)
    assert "serve_until_idle" in failures and "keep_endpoint" in failures["serve_until_idle"], failures


@pytest.mark.parametrize("backend", ["local", "gke"])
def test_check_params_passes_with_the_dags_own_params_and_holds_no_serve_slice(
    prep_and_train: Workload, tmp_path: Path, backend: str
) -> None:
    """The first task needs none of the left-out Params (the accuracy gate, the serve slice), and hands no serve
    slice on (GKE's quota check would count one)."""
    dag = build(prep_and_train, tmp_path, backend)
    check = dag.get_task("check_params")
    context = run_context(dag, check, default_params(dag))
    check.render_template_fields(context)  # on GKE: no project Variable, so no quota is read
    checked = check.execute(context)
    assert checked["topology"] == "4x4" and "serve" not in checked
    assert dag.get_task("budget_guard").slices == [
        {"role": "train", "tpu": "{{ ti.xcom_pull(task_ids='check_params') }}", "steps": "{{ params.train_steps }}"}
    ]


@pytest.mark.parametrize("backend", ["local", "gke"])
def test_the_report_of_such_a_run_has_no_evaluation_or_serving_keys(
    prep_and_train: Workload, tmp_path: Path, backend: str
) -> None:
    dag = build(prep_and_train, tmp_path, backend)
    report_task = dag.get_task("write_report")
    context = run_context(dag, report_task, default_params(dag), _TaskInstance({"train": TRAINED}))
    report_task.render_template_fields(context)
    report = report_task.execute(context)
    written = json.loads((Path(report["output_dir"]) / "report.json").read_text())
    assert written == report
    assert list(written) == ALWAYS_KEYS, written
    assert written["output_dir"] == str(tmp_path / "out" / "acme_sales_forecast" / "2026-11-03")
    assert written["training"]["checkpoint"] == "/ckpt/3"


def test_the_report_has_the_keys_of_each_step_the_run_had(tmp_path: Path) -> None:
    from tpuflow.pipeline.steps import REPORT_KEYS, write_report

    assert [*EVALUATION_KEYS, *SMOKE_KEYS, "endpoint"] == [k for keys in REPORT_KEYS.values() for k in keys]
    evaluation = {"accuracy": 0.97, "n": 200, "examples_per_s": 1000.0, "hosts_used": 4}
    answer = {"choices": [{"text": "42"}]}
    deployed = {"serve_url": "http://127.0.0.1:8000"}
    # the shipped demo: every step, every key, in the same order as ever
    demo = write_report(
        str(tmp_path / "demo"), evaluation, answer, deployed, sample_prompt="17+25=", endpoint_path="/addition/v1"
    )
    assert list(demo) == DEMO_REPORT_KEYS
    assert demo == {
        "output_dir": str(tmp_path / "demo"),
        "accuracy": 0.97,
        "heldout_examples": 200,
        "eval_examples_per_s": 1000.0,
        "eval_hosts": 4,
        "sample_prompt": "17+25=",
        "sample_completion": "42",
        "endpoint": "http://127.0.0.1:8000/addition/v1",
        "training": None,
    }
    # an evaluation but nothing served; a deploy without a smoke test; nothing but training
    assert list(write_report(str(tmp_path / "e"), {"accuracy": 0.9}, None, None)) == [
        "output_dir",
        *EVALUATION_KEYS,
        "training",
    ]
    served = write_report(str(tmp_path / "d"), None, None, deployed, endpoint_path="/acme")
    assert list(served) == ["output_dir", "endpoint", "training"] and served["endpoint"] == "http://127.0.0.1:8000/acme"
    bare = write_report(str(tmp_path / "t"), None, None, None, training={"steps_trained": 5})
    assert (
        json.loads((tmp_path / "t" / "report.json").read_text())
        == bare
        == {
            "output_dir": str(tmp_path / "t"),
            "training": {"steps_trained": 5},
        }
    )


@pytest.mark.parametrize("backend", ["local", "gke"])
def test_a_loop_that_evaluates_in_training_keeps_the_gate_param_and_the_evaluation_keys(
    prep_and_train: Workload, tmp_path: Path, backend: str
) -> None:
    from dataclasses import replace

    dag = build(replace(prep_and_train, evaluate_in_training=True), tmp_path, backend)
    assert EVALUATION_PARAMS <= set(dag.params) and not SERVING_PARAMS & set(dag.params)
    assert render_failures(dag, default_params(dag)) == {}
    xcoms = {"train": {**TRAINED, "evaluation": {"accuracy": 0.95, "n": 50}}}
    dag = build(replace(prep_and_train, evaluate_in_training=True), tmp_path, backend)  # unrendered again
    report_task = dag.get_task("write_report")
    context = run_context(dag, report_task, default_params(dag), _TaskInstance(xcoms))
    report_task.render_template_fields(context)
    report = report_task.execute(context)
    assert list(report) == ["output_dir", *EVALUATION_KEYS, "training"]
    assert (report["accuracy"], report["heldout_examples"]) == (0.95, 50)


@pytest.mark.parametrize(
    ("dag_file", "extra"), [("tpu_llm_pipeline_local.py", set()), ("tpu_llm_pipeline_gke.py", GKE_PARAMS)]
)
def test_the_shipped_dags_keep_every_param_and_render(dag_file: str, extra: set[str]) -> None:
    dag = runpy.run_path(str(REPO / "dags" / dag_file))["dag"]
    assert set(dag.params) == SHIPPED_PARAMS | extra
    # its report is wired to every step, so report.json keeps every key (DEMO_REPORT_KEYS)
    report = dag.get_task("write_report")
    assert None not in (report.evaluation, report.answer, report.deployed)
    assert render_failures(dag, default_params(dag)) == {}


def test_the_param_helpers_leave_out_only_the_missing_steps_params(prep_and_train: Workload) -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.gke import gke_pipeline_params
    from tpuflow.pipeline.params import param_specs, pipeline_params, step_params_lacking

    assert step_params_lacking(None) == step_params_lacking(ADDITION) == set()
    assert step_params_lacking(prep_and_train) == EVALUATION_PARAMS | SERVING_PARAMS
    assert set(pipeline_params()) == set(pipeline_params(workload=ADDITION)) == SHIPPED_PARAMS
    assert set(pipeline_params(workload=prep_and_train)) == SHIPPED_PARAMS - EVALUATION_PARAMS - SERVING_PARAMS
    assert set(param_specs(workload=prep_and_train)) == set(pipeline_params(workload=prep_and_train))
    assert set(gke_pipeline_params(prep_and_train)) == set(pipeline_params(workload=prep_and_train)) | GKE_PARAMS
    assert set(gke_pipeline_params()) == SHIPPED_PARAMS | GKE_PARAMS
