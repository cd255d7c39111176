"""`tpuflow run DAG_FILE`: a team's own tpu_pipeline DAG end to end through `airflow dags test`, as `tpuflow demo`
runs the shipped one.

A throw-away Airflow home under the work dir whose DAGs folder is the DAG file's folder (as in the team's own
Airflow: its package beside it, its folder on sys.path); the Variable tpuflow_backend set to the chosen backend; the
DAG file parsed and the run's conf checked against the DAG's Params first (tpuflow_rehearsal.dag_file, one line for a bad
input); the run supervised as the demo's (Ctrl-C stops its clusters and gives its leases back); then a summary of
its report.json and chip-hour ledger. The GKE rehearsal's run is tpuflow_rehearsal.run_dag_gke.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuflow.cost.goodput import ledger_lines
from tpuflow.errors import UserInputError
from tpuflow_rehearsal.dag_progress import airflow_log
from tpuflow_rehearsal.demo import dags_test, local_output_root, max_slices_env, read_report, supervised
from tpuflow_rehearsal.demo_env import demo_env, demo_storage

WHO = "tpuflow run"
PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RunRequest:
    """What `tpuflow run` was asked, checked (tpuflow_rehearsal.cli.run_cmd)."""

    dag_file: Path
    dag_id: str | None
    conf: dict[str, Any]
    run_date: str
    work_dir: Path
    output_root: str | None = None
    control_plane: str = "real"
    operation_seconds: float = 2.0
    verbose: bool = False  # --backend local: Airflow's whole log here instead of the progress lines

    @property
    def num_slices(self) -> int:
        return int(self.conf.get("num_slices", 1))


def run_env(home: Path, output_root: str, dag_file: Path, backend: str) -> dict[str, str]:
    """The run's Airflow home: the demo's, with the DAG file's folder as the DAGs folder and the backend pinned."""
    return {**demo_env(home, output_root, dags_folder=dag_file.parent), "AIRFLOW_VAR_TPUFLOW_BACKEND": backend}


def checked_dag_id(env: Mapping[str, str], request: RunRequest, *, backend: str) -> str:
    """The tpu_pipeline DAG of the file to run, its conf and date checked (tpuflow_rehearsal.dag_file, in the run's
    Airflow home); UserInputError for a bad input."""
    argv = [sys.executable, "-m", "tpuflow_rehearsal.dag_file", str(request.dag_file), "--backend", backend]
    argv += ["--conf", json.dumps(request.conf), "--date", request.run_date]
    argv += ["--dag-id", request.dag_id] if request.dag_id is not None else []
    proc = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    answer = _answer(proc.stdout)
    if answer is None:
        raise RuntimeError(f"{WHO}: parsing {request.dag_file} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    if "error" in answer:
        error = answer["error"]
        raise UserInputError(error["field"], error["value"], error["fix"])
    return str(answer["dag_id"])


def run_local(request: RunRequest) -> int:
    """The DAG on this machine's simulated slice; 0 when it succeeded."""
    with supervised(WHO) as sup:
        home = request.work_dir / "airflow"
        home.mkdir(parents=True, exist_ok=True)
        output_root = local_output_root(request.work_dir, request.output_root)
        env = {**run_env(home, output_root, request.dag_file, "local"), **sup.env()}
        dag_id = checked_dag_id(env, request, backend="local")
        with demo_storage(output_root, sup) as storage_env:
            env.update({**storage_env, **max_slices_env(request.num_slices)})
            log = None if request.verbose else airflow_log(home, request.run_date)
            code, elapsed = dags_test(
                sup, env, dag_id, request.run_date, request.conf, who=WHO, num_slices=request.num_slices, log=log
            )
            report = read_report(output_root, dag_id, request.run_date) if code == 0 else None
        kept = "tpuflow local down" if request.conf.get("keep_endpoint") else None
        return print_outcome(WHO, dag_id, report, elapsed, kept=kept, log=log)


def print_outcome(
    who: str,
    dag_id: str,
    report: Mapping[str, Any] | None,
    elapsed: float,
    *,
    kept: str | None = None,
    log: Path | None = None,
) -> int:
    """The run's summary (its report and ledger), or that it failed; the command's exit code. ``kept``: how to
    stop an endpoint the run was asked to keep (None: not asked). ``log``: where Airflow's log went (None: above)."""
    if report is None:
        where = f"Airflow's whole log: {log}" if log else "see the task logs above"
        print(f"\n{who}: {dag_id} FAILED after {elapsed:.0f}s ({where})", file=sys.stderr)
        return 1
    print(f"\n=== {who}: {dag_id} succeeded in {elapsed:.0f}s ===")
    for line in report_lines(report, kept=kept):
        print(line)
    return 0


def report_lines(report: Mapping[str, Any], *, kept: str | None = None) -> list[str]:
    """What a run's report.json says, one line per step the pipeline has (a key the workload lacks is skipped)."""
    lines = [_line("report:", f"{report['output_dir']}/report.json")]
    training = report.get("training") or {}
    if training:
        trained = ", ".join(
            text
            for text in (
                training.get("run_name"),
                f"{training['steps_trained']} steps trained" if training.get("steps_trained") is not None else None,
                f"checkpoint {training['checkpoint']}" if training.get("checkpoint") else None,
            )
            if text
        )
        lines.append(_line("training:", trained))
        if training.get("note"):
            lines.append(_line("", training["note"]))
    if report.get("accuracy") is not None:
        examples = f" on {report['heldout_examples']} examples" if report.get("heldout_examples") else ""
        lines.append(_line("held-out accuracy:", f"{report['accuracy']:.3f}{examples}"))
    if report.get("sample_completion") is not None:
        lines.append(_line("sample completion:", f"{report.get('sample_prompt')!r} -> {report['sample_completion']!r}"))
    lines += ledger_lines(report.get("ledger"))
    endpoint = (report.get("ledger") or {}).get("endpoint") or {}
    if endpoint.get("stopped"):
        lines.append(_line("endpoint (stopped):", endpoint.get("reason")))
    elif kept and report.get("endpoint"):
        lines.append(_line("endpoint (kept):", f"{report['endpoint']}  (stop it with: {kept})"))
    return lines


def _line(label: str, text: Any) -> str:
    return f"{label:<20}{text}"


def _answer(stdout: str) -> dict[str, Any] | None:
    """The probe's JSON answer: its last line of output (Airflow may print before it)."""
    for line in reversed(stdout.splitlines()):
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        if isinstance(answer, dict):
            return answer
    return None
