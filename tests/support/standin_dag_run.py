"""A throw-away Airflow home whose only DAG runs against a Kubernetes API (the imitation's or the real control
plane's), for `airflow dags test` in a subprocess (tests/support/dagtest_runner.py): the DAG file, the environment,
a migrated DB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DAGTEST_RUNNER = REPO / "tests" / "support" / "dagtest_runner.py"


def standin_airflow_home(
    home: Path, connection: Mapping[str, str], dag_name: str, dag_text: str
) -> tuple[Path, dict[str, str]]:
    """Write ``dag_text`` as ``<home>/dags/<dag_name>.py`` and migrate the home's DB; returns the DAG file and
    the environment with ``connection`` (the ``AIRFLOW_CONN_*`` variables of the Kubernetes API) in it."""
    (home / "dags").mkdir(parents=True)
    dag_file = home / "dags" / f"{dag_name}.py"
    dag_file.write_text(dag_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(connection)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONPATH": str(REPO),
        }
    )
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return dag_file, env


def dagtest_command(dag_file: Path, dag_id: str) -> list[str]:
    return [sys.executable, str(DAGTEST_RUNNER), str(dag_file), dag_id]


def run_dagtest(
    dag_file: Path, dag_id: str, env: dict[str, str], *, timeout: float = 600
) -> tuple[dict[str, Any], str]:
    """Run the DAG once (dagtest_runner.py in a subprocess, from the repository); its summary (run_id, states,
    xcoms) and the whole output. Fails, with the output's end, when the run printed no summary."""
    proc = subprocess.run(
        dagtest_command(dag_file, dag_id), env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("DAGTEST_RESULT ")]
    assert lines, output[-5000:]
    return json.loads(lines[-1].removeprefix("DAGTEST_RESULT ")), output
