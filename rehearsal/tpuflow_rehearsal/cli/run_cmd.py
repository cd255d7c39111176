"""`tpuflow run DAG_FILE`: run your own tpu_pipeline DAG file end to end, as `tpuflow demo` runs the shipped one
(locally on a simulated slice, or `--backend gke` on the GKE rehearsal): tpuflow_rehearsal.run_dag.

What can be checked here is checked before anything starts, one line each (exit 2): the file (there, Python,
parseable, a file Airflow parses), the conf (--conf JSON, --param NAME=VALUE), --date, the folders. The DAG id,
the conf against the DAG's own Params and the date against its start_date are checked next, by parsing the file.
"""

from __future__ import annotations

import argparse
import ast
import json
from datetime import date
from pathlib import Path
from typing import Any

from tpuflow.errors import UserInputError
from tpuflow.validation import check_date, check_folder, check_seconds, check_text
from tpuflow_rehearsal.demo import add_run_arguments, check_output_root_flag
from tpuflow_rehearsal.run_dag import RunRequest, run_local

DEFAULT_WORK_DIR = Path(".tpuflow") / "run"
_CONF_EXAMPLE = '\'{"topology": "2x2", "train_steps": 40}\''


def _run(args: argparse.Namespace) -> int:
    request = run_request(args)
    if args.backend == "gke":
        from tpuflow_rehearsal.run_dag_gke import run_on_rehearsal

        return run_on_rehearsal(request)
    return run_local(request)


def run_request(args: argparse.Namespace) -> RunRequest:
    """The command's flags, each checked; UserInputError names the first bad one."""
    dag_file = check_dag_file(args.dag_file)
    conf = parse_conf(args.conf, args.param)
    if args.dag_id is not None:
        check_text("--dag-id", args.dag_id, fix="give the id of a DAG the file builds")
    if args.date is not None:
        check_date("--date", args.date)  # strictly YYYY-MM-DD: the run's output folder is named so
    check_seconds("--operation-seconds", args.operation_seconds, allow_zero=True, maximum=3600)
    check_folder("--work-dir", args.work_dir)
    check_output_root_flag(args.output_root)
    if args.backend == "gke" and conf.get("keep_endpoint") and not conf.get("idle_timeout"):
        raise UserInputError(
            "params.keep_endpoint",
            conf["keep_endpoint"],
            "the rehearsal's stand-ins stop with the command: give idle_timeout too (the run serves until it is "
            "idle that long), or keep an endpoint with `tpuflow standins up` and your own Airflow",
        )
    return RunRequest(
        dag_file=dag_file,
        dag_id=args.dag_id,
        conf=conf,
        run_date=args.date or date.today().isoformat(),
        work_dir=Path(args.work_dir).resolve(),
        output_root=args.output_root,
        control_plane=args.control_plane,
        operation_seconds=args.operation_seconds,
        verbose=args.verbose,
    )


def check_dag_file(value: str) -> Path:
    """A Python file that parses and that Airflow would parse (it says "airflow" and "dag"), made absolute."""
    path = Path(value).expanduser()
    if path.is_dir():
        raise UserInputError("DAG_FILE", value, "give the DAG file itself, not its folder")
    if not path.is_file():
        raise UserInputError("DAG_FILE", value, "no such file: give the path of your DAG file")
    if path.suffix != ".py":
        raise UserInputError("DAG_FILE", value, "give a Python file (.py) that builds a tpu_pipeline DAG")
    source = path.read_bytes()
    try:
        ast.parse(source, filename=str(path))
    except SyntaxError as err:
        raise UserInputError("DAG_FILE", value, f"line {err.lineno}: {err.msg}; fix the syntax error") from None
    except ValueError as err:  # null bytes
        raise UserInputError("DAG_FILE", value, f"{err}; give a Python source file") from None
    if b"airflow" not in source.lower() or b"dag" not in source.lower():
        # Airflow's safe mode skips such a file without a word: the run would find no DAG
        raise UserInputError("DAG_FILE", value, 'Airflow parses only files that say "airflow" and "dag": add both')
    return path.resolve()


def parse_conf(text: str | None, params: list[str]) -> dict[str, Any]:
    """The run's conf: --conf's JSON object, then each --param NAME=VALUE over it (VALUE read as JSON when it is
    JSON: 40, true, null, "x"; else as text: 2x2)."""
    conf: dict[str, Any] = {}
    if text is not None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise UserInputError(
                "--conf", text, f"not JSON ({err.msg}); give a JSON object, e.g. {_CONF_EXAMPLE}"
            ) from None
        if not isinstance(value, dict):
            raise UserInputError("--conf", text, f"give a JSON object of Params, e.g. {_CONF_EXAMPLE}")
        conf.update(value)
    for item in params:
        name, equals, raw = item.partition("=")
        if not equals or not name.strip():
            raise UserInputError("--param", item, "give NAME=VALUE, e.g. --param topology=2x2")
        conf[name.strip()] = _param_value(raw)
    return conf


def _param_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "run",
        help="run your own tpu_pipeline DAG file end to end (embedded Ray and a simulated slice, or the GKE rehearsal)",
    )
    parser.add_argument(
        "dag_file", metavar="DAG_FILE", help="your DAG file; its folder is the DAGs folder, as in Airflow"
    )
    parser.add_argument("--dag-id", default=None, help="the DAG to run (default: the file's only tpu_pipeline DAG)")
    parser.add_argument("--conf", default=None, help=f"the run's Params as a JSON object, e.g. {_CONF_EXAMPLE}")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one Param (repeat it; over --conf); VALUE is read as JSON when it is JSON (40, true), else as text",
    )
    add_run_arguments(
        parser,
        verbose_help="--backend local: stream Airflow's whole log here (default: a line per task; the log goes to "
        "WORK_DIR/airflow/logs/dags-test-DATE.log)",
        work_dir=DEFAULT_WORK_DIR,
        work_dir_shown=f"{DEFAULT_WORK_DIR}/",
        outputs_of="the run",
        backend_help="local: embedded Ray with a simulated slice; gke: the GKE rehearsal (stand-ins), stopped "
        "afterwards",
    )
    parser.set_defaults(func=_run)
