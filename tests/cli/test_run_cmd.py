"""`tpuflow run DAG_FILE` (issue 45): a team's own DAG file run the way `tpuflow demo` runs the shipped one.

Bad input is one line naming the field, the value and the fix, exit 2, no traceback: what the flags alone show
before anything starts; what needs the file parsed (its DAG id, its import, the conf against its Params) right
after, before any Airflow run. End to end (slow): the team's package and DAG file from tests/support/user_pipeline.py,
in a temporary folder, run on the local backend and summarised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.user_pipeline import DAG_FILE, DAG_ID, write_user_project

from tpuflow.cli import main

# a short run (tests/pipeline/test_user_pipeline.py's CONF): the slice preflight has tests of its own
CONF = {"topology": "2x2", "train_steps": 40, "num_train": 400, "num_eval": 100, "preflight": False}
DATE = "2026-11-05"


@pytest.fixture
def team(tmp_path: Path) -> Path:
    """DAGS/acme_sales_dag.py beside its package DAGS/acme_sales/; returns the DAG file."""
    return write_user_project(tmp_path / "dags")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(["run", *argv])
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, *expected: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("tpuflow: error: "), err
    assert "Traceback" not in err
    assert all(text in lines[0] for text in expected), (expected, lines[0])
    return lines[0]


# (what to do to the team's folder, extra argv, the text the one line must hold: field, value, fix)
EARLY: list[tuple[str, list[str], tuple[str, ...]]] = [
    ("syntax", [], ("DAG_FILE=", "acme_sales_dag.py", "line 2: ", "fix the syntax error")),
    ("no-words", [], ("DAG_FILE=", 'files that say "airflow" and "dag"')),
    ("folder", [], ("DAG_FILE=", "give the DAG file itself, not its folder")),
    ("", ["--conf", "{topology: 2x2}"], ("--conf='{topology: 2x2}'", "not JSON", "give a JSON object")),
    ("", ["--conf", '["2x2"]'], ("--conf=", "give a JSON object of Params")),
    ("", ["--param", "topology"], ("--param='topology'", "give NAME=VALUE")),
    ("", ["--date", "2026-11-31"], ("--date='2026-11-31'", "YYYY-MM-DD")),
    ("", ["--work-dir", "{file}"], ("--work-dir=", "not a file")),
    ("", ["--backend", "gke", "--param", "keep_endpoint=true"], ("params.keep_endpoint=True", "idle_timeout")),
]


@pytest.mark.parametrize(("change", "argv", "expected"), EARLY, ids=[f"{c} {' '.join(a)}" for c, a, _ in EARLY])
def test_bad_input_the_flags_show_starts_nothing(
    team: Path,
    tmp_path: Path,
    change: str,
    argv: list[str],
    expected: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
    nothing_starts: list[Any],
) -> None:
    target = str(team)
    if change == "syntax":
        team.write_text('"""Airflow DAG: acme"""\nforecast = (\n')
    elif change == "no-words":
        team.write_text("x = 1\n")
    elif change == "folder":
        target = str(team.parent)
    work = [] if "--work-dir" in argv else ["--work-dir", str(tmp_path / "work")]
    code, err = run_cli([target, *work, *(a.replace("{file}", str(team)) for a in argv)], capsys)
    assert_one_line(code, err, *expected)
    assert nothing_starts == []
    assert not (tmp_path / "work").exists()


# Each needs the file parsed: one `python -m tpuflow_rehearsal.dag_file` in the run's Airflow home, no Airflow run.
PARSED: list[tuple[str, list[str], tuple[str, ...]]] = [
    (
        DAG_FILE.replace('"acme_sales.regress:fit"', '"acme_sales.regres:fit"'),
        [],
        ("DAG_FILE=", "it fails to import: UserInputError: workload.train_loop='acme_sales.regres:fit' is invalid",
         'did you mean "acme_sales.regress:fit"'),
    ),
    (DAG_FILE, ["--dag-id", "acme_sales"], ("--dag-id='acme_sales'", f"its tpu_pipeline DAGs are {DAG_ID}")),
    (DAG_FILE, ["--param", "topology=16"], ("params.topology='16'", "not a chip count", "2x8, 4x4 (16 chips)")),
    (DAG_FILE, ["--conf", '{"learning_rat": 0.1}'], ("params='learning_rat'", "Params are", "learning_rate")),
    (DAG_FILE, ["--param", "learning_rate=-1"], ("params.learning_rate=-1", "give a number > 0")),
    (DAG_FILE, ["--date", "2026-10-31"], ("--date='2026-10-31'", "on or after the DAG's start_date, 2026-11-01")),
]  # fmt: skip


@pytest.mark.parametrize(("source", "argv", "expected"), PARSED, ids=[" ".join(a) or "import" for _, a, _ in PARSED])
def test_bad_input_the_parsed_file_shows_is_one_line_before_any_run(
    team: Path,
    tmp_path: Path,
    source: str,
    argv: list[str],
    expected: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))
    team.write_text(source)
    code, err = run_cli([str(team), "--work-dir", str(tmp_path / "work"), *argv], capsys)
    assert_one_line(code, err, *expected)
    assert not (tmp_path / "work" / "airflow" / "airflow.db").exists(), "no Airflow run was started"
    assert not (tmp_path / "home").exists(), "no cluster, no lease"


@pytest.mark.slow
@pytest.mark.long  # a whole local pipeline run (3-5 min on 2 cores); make test runs a team's DAG locally end to end
@pytest.mark.timeout(
    1800
)  # in tests/pipeline/test_user_pipeline.py and on the GKE rehearsal in test_team_dag_gke_killed
def test_tpuflow_run_runs_the_team_dag_locally_and_prints_its_summary(team: Path, tmp_path: Path) -> None:
    """As a user runs it: the installed command in its own process, the DAG file's folder its DAGs folder."""
    from tpuflow.local.cluster import _pids_referencing

    home, work = tmp_path / "home", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TPUFLOW_SLICE_LEASES"))}
    env["TPUFLOW_HOME"] = str(home)
    argv = [sys.executable, "-m", "tpuflow.cli", "run", str(team), "--work-dir", str(work), "--date", DATE]
    argv += ["--conf", json.dumps({**CONF, "train_steps": 30}), "--param", "learning_rate=0.02"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1700, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    out = proc.stdout
    run_dir = work / "outputs" / DAG_ID / DATE
    assert f"tpuflow run: running {DAG_ID} for {DATE} with " in out
    assert f"=== tpuflow run: {DAG_ID} succeeded in " in out
    assert f"report:             {run_dir}/report.json" in out
    assert "training:           jax-tpu-v6e-2x2, 30 steps trained, checkpoint " in out
    assert "chip-hours billed:  " in out and "over 1 slice(s)" in out
    report = json.loads((run_dir / "report.json").read_text())
    assert report["training"]["steps_trained"] == 30 and report["ledger"]["chip_hours"] > 0, report
    assert report["ledger"]["slices"][0]["chips"] == 4 and report["ledger"]["slices"][0]["open"] is False
    # the Airflow home was the run's own, its DAGs folder the team's folder
    assert (work / "airflow" / "airflow.db").is_file()
    # nothing held or running afterwards: the lease given back, the cluster stopped
    leases = [p for p in home.glob("slice-leases/**/*.json") if "supervisors" not in p.parts]
    assert leases == [] and not list(home.glob("clusters/*/state.json"))
    assert _pids_referencing(str(home)) == []


@pytest.mark.slow
@pytest.mark.long  # a whole GKE run on the real control plane (5-9 min on 2 cores); make test runs a team's GKE DAG
# there with `airflow dags test` (tests/pipeline/test_team_dag_gke_killed.py)
@pytest.mark.timeout(2400)
@pytest.mark.skipif(os.geteuid() != 0, reason="the node agent makes network namespaces: root only")
def test_tpuflow_run_runs_the_team_dag_on_the_gke_rehearsal_and_leaves_nothing(team: Path, tmp_path: Path) -> None:
    """`tpuflow run DAG_FILE --backend gke`: the same DAG file, on the real control plane with the GKE stand-in; the
    run's node pool, RayClusters, lease and pods are gone when it returns, and it says so."""
    work = tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TPUFLOW_SLICE_LEASES"))}
    env["TPUFLOW_HOME"] = str(tmp_path / "home")
    argv = [sys.executable, "-m", "tpuflow.cli", "run", str(team), "--backend", "gke", "--work-dir", str(work)]
    argv += ["--date", DATE, "--conf", json.dumps({**CONF, "train_steps": 30}), "--operation-seconds", "0"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=2300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    out = proc.stdout
    assert "tpuflow run --backend gke: starting the real control plane" in out and "tpuflow demo" not in out
    assert f"tpuflow run --backend gke: running {DAG_ID} for {DATE} with " in out
    assert f"=== tpuflow run --backend gke: {DAG_ID} succeeded in " in out
    (left,) = [line for line in out.splitlines() if line.startswith("left behind:")]
    assert left.split(":", 1)[1].strip().startswith("nothing ("), left
    (report_path,) = work.rglob(f"{DAG_ID}/{DATE}/report.json") or [None]
    assert report_path is not None, out[-3000:]
    report = json.loads(report_path.read_text())
    (training,) = [s for s in report["ledger"]["slices"] if s["role"] == "train"]
    assert training["chips"] == 4 and training["open"] is False and training["pools"], training
    assert report["training"]["steps_trained"] == 30
