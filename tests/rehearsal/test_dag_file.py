"""tpuflow_rehearsal.dag_file: which tpu_pipeline DAG of a team's file `tpuflow run` runs, and the run's conf and date
checked against it, each refusal one UserInputError (parsed here in-process, as the command's subprocess does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.user_pipeline import DAG_FILE, DAG_ID, write_user_project

from tpuflow.errors import UserInputError
from tpuflow_rehearsal.dag_file import _last_line, chosen_pipeline, main

SECOND = '\nsecond = tpu_pipeline("acme_sales_hourly", workload=forecast, schedule="@hourly")\n'


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BACKEND", "local")
    return write_user_project(tmp_path / "dags")


def test_the_only_pipeline_is_chosen_with_its_conf_checked(team: Path) -> None:
    conf = {"topology": "2x2", "learning_rate": 0.02}
    assert chosen_pipeline(team, None, conf, backend="local", run_date="2026-11-05") == DAG_ID
    assert chosen_pipeline(team, DAG_ID, {}, backend="local") == DAG_ID


def test_several_pipelines_need_a_dag_id(team: Path) -> None:
    team.write_text(DAG_FILE + SECOND)
    with pytest.raises(UserInputError) as caught:
        chosen_pipeline(team, None, {}, backend="local")
    assert str(caught.value) == (
        f"--dag-id=None is invalid: acme_sales_dag.py builds {DAG_ID}, acme_sales_hourly: name one of them"
    )
    assert chosen_pipeline(team, "acme_sales_hourly", {}, backend="local") == "acme_sales_hourly"


def test_a_file_without_a_pipeline_names_what_it_builds(team: Path) -> None:
    team.write_text('"""Airflow DAG."""\nfrom airflow.sdk import DAG\n\nplain = DAG("acme_plain", schedule=None)\n')
    with pytest.raises(UserInputError, match=r"it builds no tpu_pipeline DAG \(only acme_plain\); build one with"):
        chosen_pipeline(team, None, {}, backend="local")
    with pytest.raises(UserInputError, match=r"--dag-id='acme_plain' is invalid: .*it builds no tpu_pipeline DAG"):
        chosen_pipeline(team, "acme_plain", {}, backend="local")


def test_a_dag_pinned_to_the_other_backend_names_the_flag(team: Path) -> None:
    team.write_text(DAG_FILE.replace('schedule="@daily"', 'schedule="@daily", backend="gke"'))
    with pytest.raises(UserInputError) as caught:
        chosen_pipeline(team, None, {}, backend="local")
    assert str(caught.value) == (
        f"--backend='local' is invalid: {DAG_ID} is pinned to the gke backend in its file (tpu_pipeline backend=); "
        "use --backend gke"
    )


def test_on_gke_the_conf_passes_the_gke_pipelines_check(team: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BACKEND", "gke")
    assert chosen_pipeline(team, None, {"zones": "us-east5-a"}, backend="gke") == DAG_ID
    with pytest.raises(UserInputError, match=r"params.topology='2x2x2' is invalid: v6e slices are 2D"):
        chosen_pipeline(team, None, {"topology": "2x2x2"}, backend="gke")


def test_the_module_answers_in_one_json_line(team: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(team), "--conf", json.dumps({"topology": "16"})]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["error"]["field"] == "params.topology" and answer["error"]["value"] == "16"
    assert "not a chip count" in answer["error"]["fix"]
    assert main([str(team)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"dag_id": DAG_ID}


def test_an_import_error_is_its_last_line_with_the_exception_named_plainly() -> None:
    error = (
        "Traceback (most recent call last):\n  File x\ntpuflow.errors.UserInputError: workload.prep='a' is invalid: b\n"
    )
    assert _last_line(error) == "UserInputError: workload.prep='a' is invalid: b"
    assert _last_line("NameError: name 'x' is not defined") == "NameError: name 'x' is not defined"
