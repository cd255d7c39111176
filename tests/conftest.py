"""Shared fixtures: a real embedded Ray cluster simulating two v6e 2x4 slices (started once), a real local
Airflow (started once, for tests/airflow_services and the fault matrix's Airflow rows), and task contexts for
running operators without a scheduler. Helpers live in the package tests/support."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from support.airflow_context import new_run_id, task_context
from support.ray_cluster import running_cluster

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parents[1]

# Airflow reads its home when first imported: give the whole session a throw-away home whose
# DAGs folder holds the project's DAG files (dag.test() and DagBag read them from there).
if "airflow" not in sys.modules:
    _home = Path(tempfile.mkdtemp(prefix="tpuflow-airflow-"))
    (_home / "dags").mkdir()
    for dag_file in (REPO / "dags").glob("*.py"):
        (_home / "dags" / dag_file.name).symlink_to(dag_file)
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = str(_home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_home / "dags")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"


@pytest.fixture(scope="session")
def migrated_airflow_db() -> Path:
    """A migrated metadata DB in the throw-away Airflow home (once per session)."""
    from airflow import settings
    from airflow.utils.db import upgradedb

    upgradedb()
    return Path(settings.DAGS_FOLDER)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One fake-gcs-server on a free loopback port for the session (tests/gcs and the gs:// demo run)."""
    from tpuflow_rehearsal.gcs_emulator import GcsEmulator

    emulator = GcsEmulator.start(state_dir=tmp_path_factory.mktemp("gcs-emulator"))
    try:
        yield emulator
    finally:
        assert emulator.stop(), "the emulator died during the session"
        assert not emulator.is_alive()


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real local Airflow (api-server, scheduler, dag-processor, triggerer), as `tpuflow airflow up` starts it,
    with the project's DAGs and tests/airflow_services/dags; the session fails if any of its processes outlive
    its stop (support.real_airflow.running_airflow)."""
    from support.real_airflow import running_airflow

    base = tmp_path_factory.mktemp("real-airflow")
    extra = sorted((Path(__file__).parent / "airflow_services" / "dags").glob("*.py"))
    with running_airflow(
        base, extra, ["tpu_llm_pipeline_local", "tpuflow_slice_lease_probe", "tpuflow_xcom_probe"]
    ) as svc:
        yield svc


@pytest.fixture(scope="session")
def api(services: Any) -> Any:
    return services.api()


@pytest.fixture(scope="session")
def cluster_base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clusters")


@pytest.fixture(scope="session")
def slice_cluster(cluster_base_dir: Path) -> Iterator:
    """Two simulated v6e 2x4 slices (two 4-chip hosts each) plus a head, shared by the Ray-facing tests:
    the smallest shape with several slices of several hosts. On a loaded 2-core machine a node's raylet
    can abort every try (Ray 2.60 waits a fixed 15 s for its dashboard agent), so the whole start is
    tried a second time before failing."""
    from tpuflow.local.cluster import LocalClusterError

    for attempt in range(2):
        with ExitStack() as stack:
            try:
                cluster = stack.enter_context(
                    running_cluster("pytest-v6e", cluster_base_dir, "TPU-V6E", "2x4", "ct6e-standard-4t", num_slices=2)
                )
            except LocalClusterError:
                if attempt:
                    raise
                continue
            yield cluster
            return


@pytest.fixture
def fresh_context(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """A builder of execute() contexts, each for a task instance of a new DAG run unless ``run_id``
    names one; the DAG is "<test folder>_tests"."""
    dag_id = f"{request.path.parent.name}_tests"

    def make(task_id: str = "job", run_id: str | None = None, **identity: Any) -> dict[str, Any]:
        return task_context(dag_id=dag_id, run_id=run_id or new_run_id(), task_id=task_id, **identity)

    return make


@pytest.fixture
def dags_folder(migrated_airflow_db: Path) -> Iterator[Path]:
    """The session's DAGs folder with the shipped GKE pipeline DAG file in it (tests/support/gke_pipeline.py)."""
    from support.gke_pipeline import dag_in_folder

    with dag_in_folder(migrated_airflow_db) as folder:
        yield folder


@pytest.fixture
def gke() -> Iterator[Any]:
    """The GKE stand-in with only the pipeline's cluster (tests/gke and tests/cost have their own)."""
    from support.gke_pipeline import gke_standin

    with gke_standin() as standin:
        yield standin


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts (tests/support/processes.sleeper); the test's end stops exactly those, by pid."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
