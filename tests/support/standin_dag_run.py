"""A throw-away Airflow home whose only DAG runs against a KubeRay stand-in, for `airflow dags test`
in a subprocess (tests/support/dagtest_runner.py): the DAG file, the environment, a migrated DB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DAGTEST_RUNNER = REPO / "tests" / "support" / "dagtest_runner.py"


def standin_airflow_home(home: Path, kube: Any, dag_name: str, dag_text: str) -> tuple[Path, dict[str, str]]:
    """Write ``dag_text`` as ``<home>/dags/<dag_name>.py`` and migrate the home's DB; returns the DAG
    file and the environment in which the stand-in is the ``kube_standin`` connection."""
    (home / "dags").mkdir(parents=True)
    dag_file = home / "dags" / f"{dag_name}.py"
    dag_file.write_text(dag_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(kube.connection_env("kube_standin"))
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
