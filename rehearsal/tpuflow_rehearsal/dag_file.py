"""A team's DAG file as `tpuflow run` sees it before running it: which tpu_pipeline DAG it builds, and the run's
conf checked against that DAG's Params (each Param's schema, then the pipeline's cross-field check), so a bad
input is one line before any Airflow run, cluster or stand-in starts.

Runs as ``python -m tpuflow_rehearsal.dag_file`` in the run's own Airflow home (the file is parsed as Airflow parses it:
its folder is the DAGs folder, on sys.path) and prints one JSON line: ``{"dag_id": ...}`` or ``{"error": {"field",
"value", "fix"}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from airflow.dag_processing.dagbag import BundleDagBag
from airflow.sdk import DAG

from tpuflow.errors import UserInputError
from tpuflow.pipeline.gke import check_gke_params
from tpuflow.pipeline.params import ParamSpec, check_conf, validate_params
from tpuflow.pipeline.steps import CheckParamsOperator


def chosen_pipeline(
    dag_file: Path, dag_id: str | None, conf: Mapping[str, Any], *, backend: str, run_date: str | None = None
) -> str:
    """The id of the tpu_pipeline DAG of ``dag_file`` to run (``dag_id``, else the only one), with ``conf`` and
    ``run_date`` valid for it on ``backend``; UserInputError otherwise."""
    bag = BundleDagBag(dag_folder=str(dag_file), bundle_path=dag_file.parent)  # its folder on sys.path, as Airflow
    if bag.import_errors:
        (error,) = bag.import_errors.values()
        raise UserInputError("DAG_FILE", str(dag_file), f"it fails to import: {_last_line(str(error))}")
    dag = _pick(dag_file, dag_id, bag.dags)
    _check_backend(dag, backend)
    _check_conf(dag, conf, backend)
    if run_date is not None and dag.start_date is not None and date.fromisoformat(run_date) < dag.start_date.date():
        # Airflow would run none of its tasks and call the run a success
        raise UserInputError(
            "--date", run_date, f"give a date on or after the DAG's start_date, {dag.start_date:%Y-%m-%d}"
        )
    return dag.dag_id


def is_pipeline(dag: DAG) -> bool:
    """Built by tpu_pipeline (either backend): its first task is the pipeline's check_params."""
    return isinstance(dag.task_dict.get("check_params"), CheckParamsOperator)


def _pick(dag_file: Path, dag_id: str | None, dags: Mapping[str, DAG]) -> DAG:
    pipelines = sorted(name for name, dag in dags.items() if is_pipeline(dag))
    if dag_id is not None:
        if dag_id not in pipelines:
            found = (
                f"its tpu_pipeline DAGs are {', '.join(pipelines)}" if pipelines else "it builds no tpu_pipeline DAG"
            )
            raise UserInputError("--dag-id", dag_id, f"{dag_file.name} has no such tpu_pipeline DAG: {found}")
        return dags[dag_id]
    if len(pipelines) == 1:
        return dags[pipelines[0]]
    if not pipelines:
        others = f" (only {', '.join(sorted(dags))})" if dags else ""
        fix = f"it builds no tpu_pipeline DAG{others}; build one with tpuflow.pipeline.dag.tpu_pipeline"
        raise UserInputError("DAG_FILE", str(dag_file), fix)
    raise UserInputError("--dag-id", None, f"{dag_file.name} builds {', '.join(pipelines)}: name one of them")


def _check_backend(dag: DAG, backend: str) -> None:
    built = "gke" if "create_node_pool" in dag.task_dict else "local"
    if built != backend:
        fix = (
            f"{dag.dag_id} is pinned to the {built} backend in its file (tpu_pipeline backend=); use --backend {built}"
        )
        raise UserInputError("--backend", backend, fix)


def _check_conf(dag: DAG, conf: Mapping[str, Any], backend: str) -> None:
    specs = {name: ParamSpec(param.value, **param.schema) for name, param in _params(dag).items()}
    values = check_conf(dict(conf), specs)
    if backend == "gke":
        check_gke_params(values)
    else:
        validate_params(values)


def _params(dag: DAG) -> dict[str, Any]:
    return {name: dag.params.get_param(name) for name in dag.params}


def _last_line(error: str) -> str:
    """An import error's last line, its exception named without its module (UserInputError: ...)."""
    line = next((text.strip() for text in reversed(error.splitlines()) if text.strip()), error)
    kind, colon, message = line.partition(": ")
    return f"{kind.rpartition('.')[2]}: {message}" if colon and " " not in kind else line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuflow_rehearsal.dag_file")
    parser.add_argument("dag_file", type=Path)
    parser.add_argument("--dag-id", default=None)
    parser.add_argument("--conf", default="{}")
    parser.add_argument("--backend", default="local", choices=("local", "gke"))
    parser.add_argument("--date", default=None)
    args = parser.parse_args(argv)
    try:
        dag_id = chosen_pipeline(
            args.dag_file, args.dag_id, json.loads(args.conf), backend=args.backend, run_date=args.date
        )
    except UserInputError as err:
        print(json.dumps({"error": {"field": err.field, "value": err.value, "fix": err.fix}}, default=str))
        return 0
    print(json.dumps({"dag_id": dag_id}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
