"""tpuflow.pipeline.dag.tpu_pipeline: the backend from the Variable tpuflow_backend (or pinned), one line for a
bad value, GKE overrides checked, and a user's own task placed inside the slice's lifetime (DAG structure only;
no Ray, no stand-ins)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.python_packages import acme_sales

from tpuflow.errors import UserInputError
from tpuflow.pipeline.dag import configured_backend, tpu_pipeline
from tpuflow.pipeline.workload import Workload


@pytest.fixture
def workload(tmp_path: Path) -> Workload:
    return Workload(
        code_dir=acme_sales(tmp_path), prep="acme_sales.build_features", train_loop="acme_sales.regress:fit"
    )


def build(workload: Workload, tmp_path: Path, **kwargs: Any) -> Any:
    return tpu_pipeline("acme_sales_forecast", workload=workload, output_root=str(tmp_path / "out"), **kwargs)


def test_the_variable_chooses_the_backend_and_local_is_the_default(
    workload: Workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW_VAR_TPUFLOW_BACKEND", raising=False)
    assert configured_backend() == "local"
    local = build(workload, tmp_path)
    assert "start_cluster" in local.task_ids and "create_node_pool" not in local.task_ids
    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BACKEND", " GKE ")
    gke = build(workload, tmp_path)
    assert "create_node_pool" in gke.task_ids and "start_cluster" not in gke.task_ids
    # the GKE settings are the Variables, rendered when a task runs; the output root given in the call wins
    assert "tpuflow_gke_cluster" in gke.get_task("create_node_pool").cluster_name
    assert gke.get_task("train").storage_path.startswith(str(tmp_path / "out"))
    # a pinned backend ignores the Variable
    assert "start_cluster" in build(workload, tmp_path, backend="local").task_ids


def test_a_bad_backend_is_one_line_naming_the_variable(
    workload: Workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BACKEND", "kubernetes")
    with pytest.raises(UserInputError) as caught:
        build(workload, tmp_path)
    assert str(caught.value).count("\n") == 0
    assert "Variable tpuflow_backend" in str(caught.value) and "'kubernetes'" in str(caught.value)
    assert "local or gke" in str(caught.value)
    with pytest.raises(UserInputError, match="backend"):
        build(workload, tmp_path, backend="gcp")


@pytest.mark.parametrize("backend", ["local", "gke"])
@pytest.mark.parametrize(
    ("kwargs", "field", "example"),
    [
        ({"accelerator": "TPU-V6E", "topology": "2x2"}, "accelerator='TPU-V6E'", '{"accelerator": "TPU-V6E", "topology": "2x2"}'),
        ({"topology": "4x4"}, "topology='4x4'", '{"topology": "4x4"}'),
        ({"machine_type": "ct6e-standard-4t"}, "machine_type='ct6e-standard-4t'", '{"machine_type": "ct6e-standard-4t"}'),
        ({"num_slices": 2}, "num_slices=2", '{"num_slices": 2}'),
        ({"tpu_slice": {"accelerator": "v6e", "topology": "2x2"}}, "tpu_slice=", '{"accelerator": "v6e", "topology": "2x2"}'),
    ],
)  # fmt: skip
def test_a_slice_given_as_a_dag_argument_is_one_line_naming_tpu_slice(
    workload: Workload, tmp_path: Path, backend: str, kwargs: dict[str, Any], field: str, example: str
) -> None:
    """The old accelerator= / topology= arguments: not Airflow's TypeError, but where the slice is given now."""
    with pytest.raises(UserInputError) as caught:
        build(workload, tmp_path, backend=backend, **kwargs)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"{field}"), line
    assert "tpu_slice" in line and "Params accelerator, topology" in line and f"conf {example}" in line, line


def test_the_builders_refuse_a_slice_argument_too(workload: Workload, tmp_path: Path) -> None:
    from tpuflow.pipeline.factory import build_pipeline_dag
    from tpuflow.pipeline.gke import build_gke_pipeline_dag

    with pytest.raises(UserInputError, match=r"^accelerator='TPU-V6E' is invalid: .*tpu_slice"):
        build_pipeline_dag("acme", workload=workload, output_root=str(tmp_path), accelerator="TPU-V6E")
    gke = {"project_id": "p", "location": "us-east5-b", "cluster_name": "c", "image": "img"}
    with pytest.raises(UserInputError, match=r"^topology='2x2' is invalid: .*tpu_slice"):
        build_gke_pipeline_dag("acme", workload=workload, output_root=str(tmp_path), topology="2x2", **gke)


def test_gke_overrides_are_build_gke_pipeline_dag_arguments(workload: Workload, tmp_path: Path) -> None:
    dag = build(workload, tmp_path, backend="gke", gke={"capacity": "spot", "cluster_name": "acme"})
    assert dag.get_task("create_node_pool").capacity == "spot"
    assert dag.get_task("create_node_pool").cluster_name == "acme"
    with pytest.raises(UserInputError) as caught:
        build(workload, tmp_path, backend="gke", gke={"capcity": "spot"})
    assert "gke['capcity']" in str(caught.value) and "capacity" in str(caught.value)
    with pytest.raises(UserInputError, match="gke\\['schedule'\\]"):  # given in the call itself
        build(workload, tmp_path, backend="gke", gke={"schedule": None})


@pytest.mark.parametrize("backend", ["local", "gke"])
def test_a_users_own_task_runs_inside_the_slices_lifetime_and_their_tags_are_kept(
    backend: str, workload: Workload, tmp_path: Path
) -> None:
    from airflow.providers.standard.operators.empty import EmptyOperator

    dag = build(workload, tmp_path, backend=backend, tags=["acme"], default_args={"owner": "acme"})
    assert {"acme", "tpuflow"} <= set(dag.tags)
    assert dag.default_args["owner"] == "acme" and dag.default_args["retries"] == 1
    with dag:
        publish_forecast = EmptyOperator(task_id="publish_forecast")
    dag.get_task("train") >> publish_forecast >> dag.get_task("write_report")
    teardown = "stop_cluster" if backend == "local" else "delete_ray_cluster"
    assert "publish_forecast" in dag.get_task("write_report").get_flat_relative_ids(upstream=True)
    if backend == "local":  # the local slice stops after the report, so after the user's task
        assert "publish_forecast" in dag.get_task(teardown).get_flat_relative_ids(upstream=True)
    assert dag.get_task(teardown).is_teardown


def test_a_workloads_own_params_join_the_form_and_reach_its_train_loop(tmp_path: Path) -> None:
    from airflow.sdk import Param

    spec = {"code_dir": acme_sales(tmp_path), "train_loop": "acme_sales.regress:fit"}
    own = Workload(
        **spec,
        params={"horizon": Param(7, type="integer", minimum=1)},
        train_loop_config={"horizon": "{{ params.horizon }}"},
    )
    for backend in ("local", "gke"):
        dag = build(own, tmp_path, backend=backend)
        assert dag.params["horizon"] == 7 and "topology" in dag.params
        assert dag.get_task("train").train_loop_config == {
            "horizon": "{{ params.horizon }}",
            "num_steps": "{{ params.train_steps }}",
            "checkpoint_every": "{{ params.checkpoint_every }}",
        }
    with pytest.raises(UserInputError) as caught:
        build(Workload(**spec, params={"topology": "2x2"}), tmp_path, backend="local")
    assert "workload.params['topology']" in str(caught.value) and "has a Param topology" in str(caught.value)
    with pytest.raises(UserInputError, match=r"train_loop_config\['num_steps'\].*train_steps"):
        Workload(**spec, train_loop_config={"num_steps": 5})
    with pytest.raises(UserInputError, match=r"train_loop_config\['checkpoint_every'\].*Param checkpoint_every"):
        Workload(**spec, train_loop_config={"checkpoint_every": 50})
    with pytest.raises(UserInputError, match=r"params\['bad-name'\]"):
        Workload(**spec, params={"bad-name": 1})


class MetadataDb:
    """What a DAG processor's or a task runner's supervisor answers a DAG file: Variables and task counts."""

    def __init__(self, variables: dict[str, str]) -> None:
        self.variables = dict(variables)
        self.unfinished = 0  # task instances of the DAG not finished yet, in every run

    def send(self, msg: Any) -> Any:
        from airflow.sdk.exceptions import ErrorType
        from airflow.sdk.execution_time.comms import ErrorResponse, OKResponse, TICount, VariableResult

        kind = type(msg).__name__
        if kind == "GetVariable":
            if msg.key not in self.variables:
                return ErrorResponse(error=ErrorType.VARIABLE_NOT_FOUND)
            return VariableResult(key=msg.key, value=self.variables[msg.key])
        if kind == "PutVariable":
            self.variables[msg.key] = msg.value
            return OKResponse(ok=True)
        if kind == "GetTICount":
            assert msg.dag_id == "acme_sales_forecast" and "running" in msg.states and "null" in msg.states
            return TICount(count=self.unfinished)
        return None  # MaskSecret and the like


def test_an_admin_switching_the_backend_mid_run_reshapes_no_run_in_flight(
    workload: Workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Variable tpuflow_backend changed while a local run is in flight: every parse (the DAG processor's, whose
    shape the scheduler gives the running run, and each of its tasks' workers') keeps building the local pipeline
    until the run is done; the runs after it are on GKE."""
    from airflow.sdk.execution_time import task_runner

    monkeypatch.delenv("AIRFLOW_VAR_TPUFLOW_BACKEND", raising=False)
    db = MetadataDb({"tpuflow_backend": "local"})
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", db, raising=False)

    assert "start_cluster" in build(workload, tmp_path).task_ids
    db.unfinished = 14  # a run is created (its tasks have no state yet) and starts
    db.variables["tpuflow_backend"] = "gke"  # the admin switches the backend
    for _parse in ("dag processor", "the run's next task"):
        dag = build(workload, tmp_path)
        assert "start_cluster" in dag.task_ids and "create_node_pool" not in dag.task_ids, "the run was re-shaped"
    db.unfinished = 0  # the run is done
    assert "create_node_pool" in build(workload, tmp_path).task_ids, "the next runs follow the Variable"
    db.unfinished = 14  # and keep GKE in their turn
    db.variables["tpuflow_backend"] = "local"
    assert "create_node_pool" in build(workload, tmp_path).task_ids
