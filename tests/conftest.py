"""Shared fixtures: a real embedded Ray cluster simulating two v6e 4x4 slices (started once)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
def cluster_base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clusters")


@pytest.fixture(scope="session")
def slice_cluster(cluster_base_dir: Path) -> Iterator:
    """Two simulated v6e 4x4 slices (8 TPU hosts) plus a head, shared by the Ray-facing tests."""
    from tpuflow.local.cluster import LocalRayCluster, _pids_referencing
    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec("TPU-V6E", "4x4", num_slices=2)
    cluster = LocalRayCluster.start(tpu, "pytest-v6e", cluster_base_dir, head_cpus=2, timeout=600)
    try:
        yield cluster
    finally:
        cluster.stop()
        assert _pids_referencing(cluster.temp_dir) == [], "processes of the test cluster outlived stop()"
