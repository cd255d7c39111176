"""What every demo run sets up around `airflow dags test`, local or on the stand-ins: a throw-away Airflow
home, and for a gs:// output root the GCS emulator it writes to (`tpuflow run` too, with its DAG file's folder)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from tpuflow_rehearsal.supervise import Interrupted, Supervisor

REPO = Path(__file__).resolve().parents[2]


def demo_env(home: Path, output_root: Path | str, dags_folder: Path = REPO / "dags") -> dict[str, str]:
    """A throw-away Airflow home so the demo never touches a user's own Airflow (``dags_folder``: the shipped
    DAGs; `tpuflow run`: the folder of the team's DAG file)."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "TPUFLOW_OUTPUT_ROOT": str(output_root),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    return env


@contextlib.contextmanager
def demo_storage(output_root: str, sup: Supervisor | None = None) -> Iterator[dict[str, str]]:
    """Environment for a gs:// output root: STORAGE_EMULATOR_HOST of the emulator the demo writes to."""
    if not output_root.startswith("gs://"):
        yield {}
        return
    from tpuflow.storage import split_gs_uri
    from tpuflow_rehearsal.gcs_emulator import EMULATOR_ENV, emulator_for

    bucket, _ = split_gs_uri(output_root, "--output-root")
    started = not os.environ.get(EMULATOR_ENV, "").strip()
    with noting(sup, "stopped the GCS emulator it started" if started else ""), emulator_for([bucket]) as url:
        print(f"tpuflow demo: outputs go to {output_root} on the GCS emulator at {url}", flush=True)
        before = os.environ.get(EMULATOR_ENV)
        os.environ[EMULATOR_ENV] = url  # for reading the report back here
        try:
            yield {EMULATOR_ENV: url}
        finally:
            if before is None:
                os.environ.pop(EMULATOR_ENV, None)
            else:
                os.environ[EMULATOR_ENV] = before


@contextlib.contextmanager
def noting(sup: Supervisor | None, cleaned: str) -> Iterator[None]:
    """Tell ``sup`` that unwinding the blocks inside this one cleaned ``cleaned`` when a signal unwinds it."""
    try:
        yield
    except Interrupted:
        if sup is not None and cleaned:
            sup.note(cleaned)
        raise
