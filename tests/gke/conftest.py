"""Fixtures for the GKE node pool tests: the GKE API stand-in, an Airflow connection to it, a task
context for running operators directly, and a throw-away Airflow home for ``dag.test()``."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Airflow reads its home and config when first imported: point it at a throw-away home unless
# something (another conftest) already configured and imported it.
_OWN_HOME: Path | None = None
if "airflow" not in sys.modules:
    _OWN_HOME = _home = Path(tempfile.mkdtemp(prefix="tpuflow-gke-airflow-"))
    (_home / "dags").mkdir()
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = str(_home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_home / "dags")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

from support.dag_modules import import_dag_module, remove_dag_module  # noqa: E402
from support.gke_standin import connected_standin  # noqa: E402

from tpuflow_rehearsal.standins.gke_api import GKEApiStandin  # noqa: E402


@pytest.fixture
def gke(monkeypatch: pytest.MonkeyPatch) -> Iterator[GKEApiStandin]:
    """A running stand-in (0.2 s per operation) and the Airflow connection ``gke_standin`` to it."""
    with connected_standin(monkeypatch, operation_seconds=0.2) as standin:
        yield standin


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated metadata DB in the throw-away Airflow home (once per session)."""
    from airflow import settings
    from airflow.utils.db import upgradedb

    if (
        _OWN_HOME is None
        and Path(settings.AIRFLOW_HOME).expanduser().resolve() == Path("~/airflow").expanduser().resolve()
    ):
        pytest.skip("Airflow was imported with the default ~/airflow home; not migrating a real metadata DB")
    upgradedb()
    return Path(settings.DAGS_FOLDER)


@pytest.fixture
def dag_file(airflow_db: Path) -> Iterator[Any]:
    """Write a DAG module into the DAGs folder (dag.test() needs it there), import it, remove it after."""
    written: list[str] = []

    def write(module_name: str, source: str) -> Any:
        written.append(module_name)
        return import_dag_module(airflow_db, module_name, source)

    yield write
    for module_name in written:
        remove_dag_module(airflow_db, module_name)
