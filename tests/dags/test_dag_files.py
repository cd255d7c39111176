"""DAG files load cleanly, cheaply, and wire setup/teardown so clusters are always stopped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"
HEAVY = ("ray", "jax", "torch", "kubernetes", "google.cloud", "optax")


def test_dag_files_import_nothing_heavy_at_parse_time():
    # A fresh interpreter, as the dag processor would be: Airflow loaded, then the DAG files.
    code = (
        "import sys, importlib.util, airflow.sdk\n"
        "before = set(sys.modules)\n"
        f"for f in sorted(__import__('pathlib').Path({str(DAGS)!r}).glob('*.py')):\n"
        "    spec = importlib.util.spec_from_file_location(f.stem, f)\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        f"print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in {HEAVY!r} or m.startswith('google.cloud')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", f"heavy modules imported while parsing DAG files: {out.stdout}"


def test_local_pipeline_shape(migrated_airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    dag = bag.get_dag("tpu_llm_pipeline_local")
    assert dag is not None
    assert dag.catchup is False and dag.max_active_runs == 1 and dag.schedule is not None
    order = ["check_params", "acquire_slice", "start_cluster", "prep", "train", "evaluate", "build_serve_config",
             "deploy", "smoke_test", "write_report", "stop_cluster", "release_slice"]
    for up, down in zip(order, order[1:], strict=False):
        assert down in dag.get_task(up).downstream_task_ids
    start, stop = dag.get_task("start_cluster"), dag.get_task("stop_cluster")
    assert start.is_setup and stop.is_teardown
    # A slice lease spans the cluster's life, so a backfill (own max_active_runs) never holds two slices.
    assert dag.get_task("acquire_slice").is_setup and dag.get_task("release_slice").is_teardown
    assert set(dag.params) >= {"accelerator", "topology", "framework", "train_steps", "accuracy_threshold", "keep_endpoint"}
