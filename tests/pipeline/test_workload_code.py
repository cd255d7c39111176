"""Mistakes in a team's step paths are caught before anything bills (issue 45): with a ``code_dir`` the DAG file's
import fails in one line naming the Workload field, the value and the fix, without importing the team's code;
without one (modules in the image) the check_params task resolves what this machine can see and says nothing
about the rest. tpuflow's own workloads resolve as before."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.user_pipeline import DAG_FILE, DAG_ID, write_user_project

from tpuflow.errors import UserInputError
from tpuflow.pipeline.dag import tpu_pipeline
from tpuflow.pipeline.params import pipeline_params
from tpuflow.pipeline.steps import CheckParamsOperator
from tpuflow.pipeline.workload import Workload


def parse(dag_file: Path) -> Any:
    """The file parsed as Airflow's DAG processor parses it (its folder on sys.path)."""
    from airflow.dag_processing.dagbag import BundleDagBag

    return BundleDagBag(dag_folder=str(dag_file), bundle_path=dag_file.parent)


def import_error(bag: Any) -> str:
    """The one import error's last line: the exception the DAG file raised."""
    (error,) = bag.import_errors.values()
    return str(error).strip().splitlines()[-1]


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Path]:
    """DAGS/acme_sales_dag.py beside DAGS/acme_sales/, a team's own layout; returns the DAGs folder."""
    write_user_project(tmp_path / "dags")
    yield tmp_path / "dags"
    for name in [m for m in sys.modules if m.split(".")[0] == "acme_sales"]:
        del sys.modules[name]


def test_the_team_dag_file_parses_without_importing_the_team_package(team: Path) -> None:
    bag = parse(team / "acme_sales_dag.py")
    assert bag.import_errors == {} and DAG_ID in bag.dags
    assert not [m for m in sys.modules if m.split(".")[0] == "acme_sales"]


@pytest.mark.parametrize(
    ("typo", "fixed", "field", "fix"),
    [
        # a module that is not in code_dir: the closest one named, the package's modules listed
        ('"acme_sales.regres:fit"', "acme_sales.regres:fit", "workload.train_loop", 'did you mean "acme_sales.regress:fit"'),
        # a function the module does not define at its top level
        ('"acme_sales.regress:fitt"', "acme_sales.regress:fitt", "workload.train_loop", 'did you mean "acme_sales.regress:fit"'),
        ('"acme_sales.build_feature"', "acme_sales.build_feature", "workload.prep", 'did you mean "acme_sales.build_features"'),
        ('"acme_sales.limits:chek"', "acme_sales.limits:chek", "workload.check_params", 'did you mean "acme_sales.limits:check"'),
        # {framework} stands for each framework: the torch module is missing
        ('"acme_sales.regress_{framework}:fit"', "acme_sales.regress_{framework}:fit", "workload.train_loop", "with framework jax, no module acme_sales.regress_jax"),
    ],
)  # fmt: skip
def test_a_typo_in_a_step_is_a_one_line_dag_import_error(
    team: Path, typo: str, fixed: str, field: str, fix: str
) -> None:
    original = {"workload.train_loop": '"acme_sales.regress:fit"', "workload.prep": '"acme_sales.build_features"'}
    original["workload.check_params"] = '"acme_sales.limits:check"'
    source = DAG_FILE.replace(original[field], typo)
    assert source != DAG_FILE
    dag_file = team / "acme_sales_dag.py"
    dag_file.write_text(source)
    bag = parse(dag_file)
    assert DAG_ID not in bag.dags
    line = import_error(bag)
    assert line.startswith(f"tpuflow.errors.UserInputError: {field}='{fixed}' is invalid: "), line
    assert fix in line, line
    assert len(line) < 400, line
    assert not [m for m in sys.modules if m.split(".")[0] == "acme_sales"]  # found, never imported


def test_a_framework_template_is_checked_for_every_framework(team: Path) -> None:
    (team / "acme_sales" / "regress_jax.py").write_text("def fit(config):\n    pass\n")
    dag_file = team / "acme_sales_dag.py"
    dag_file.write_text(DAG_FILE.replace('"acme_sales.regress:fit"', '"acme_sales.regress_{framework}:fit"'))
    line = import_error(parse(dag_file))
    assert "with framework torch, no module acme_sales.regress_torch" in line
    assert "or leave {framework} out if the workload trains with one framework" in line
    (team / "acme_sales" / "regress_torch.py").write_text("def fit(config):\n    pass\n")
    assert parse(dag_file).import_errors == {}


# --- code_dir None: the modules are in the image; check_params resolves what it can see ------------------
def check_params_task(workload: Workload, **params: Any) -> dict[str, Any]:
    values = {name: param.value for name, param in pipeline_params().items()} | params
    return CheckParamsOperator(task_id="check_params", workload=workload).execute({"params": values})


@pytest.fixture
def image_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """acme_img, importable here (as in an image Airflow shares with the cluster) but never shipped: code_dir None."""
    package = tmp_path / "site" / "acme_img"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "fit_jax.py").write_text("def loop(config):\n    pass\n")
    (package / "prep.py").write_text("")
    monkeypatch.syspath_prepend(str(package.parent))
    return package


def test_without_code_dir_nothing_is_judged_while_parsing(image_package: Path, tmp_path: Path) -> None:
    workload = Workload(train_loop="acme_img.fit_jax:lop", prep="acme_img.prepp")
    dag = tpu_pipeline("acme_img_daily", workload=workload, backend="local", output_root=str(tmp_path))
    assert "check_params" in dag.task_ids


def test_without_code_dir_check_params_resolves_what_it_can_see(image_package: Path) -> None:
    with pytest.raises(UserInputError) as caught:
        check_params_task(Workload(train_loop="acme_img.fit_jax:lop"))
    assert str(caught.value).startswith("workload.train_loop='acme_img.fit_jax:lop' is invalid: ")
    assert 'did you mean "acme_img.fit_jax:loop"' in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(UserInputError, match=r"workload.prep='acme_img.prepp' is invalid: no module acme_img.prepp"):
        check_params_task(Workload(train_loop="acme_img.fit_jax:loop", prep="acme_img.prepp"))
    # the run's framework only: torch has no module, and a jax run does not need one
    templated = Workload(train_loop="acme_img.fit_{framework}:loop", prep="acme_img.prep")
    assert check_params_task(templated, framework="jax")["topology"] == "4x4"
    with pytest.raises(UserInputError, match="with framework torch, no module acme_img.fit_torch"):
        check_params_task(templated, framework="torch")
    assert "acme_img" not in sys.modules


def test_steps_this_machine_cannot_see_are_not_judged() -> None:
    """A package only the cluster's image has: check_params says nothing (the job's import will)."""
    workload = Workload(train_loop="only_in_the_image.fit:loop", prep="only_in_the_image.prep")
    assert check_params_task(workload)["topology"] == "4x4"


def test_tpuflows_own_workloads_resolve_for_both_frameworks() -> None:
    """The shipped DAGs' workload (code_dir None: tpuflow.workloads, every Ray job's working_dir)."""
    from tpuflow.workloads.addition.pipeline import ADDITION

    ADDITION.check_code(["jax", "torch"])
    for framework in ("jax", "torch"):
        assert check_params_task(ADDITION, framework=framework)["topology"] == "4x4"
