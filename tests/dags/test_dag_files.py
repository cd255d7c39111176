"""DAG files load cleanly, cheaply, and wire setup/teardown so clusters are always stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from support.parse_cost import HEAVY
from support.pipeline_steps import TRAIN_TO_REPORT

from tpuflow.pipeline.factory import KEEP_AFTER_WATCH

DAGS = Path(__file__).resolve().parents[2] / "dags"
PARSE = """
import importlib.util, json, sys
import airflow.sdk
before = set(sys.modules)
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("dag_under_test", path)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(json.dumps(sorted(set(sys.modules) - before)))
"""


@pytest.mark.parametrize("dag_file", sorted(p.name for p in DAGS.glob("*.py")))
def test_dag_file_imports_nothing_heavy_at_parse_time(dag_file: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PARSE, str(DAGS / dag_file)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=DAGS.parent,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"{dag_file} loads these while being parsed (import them where they are used): {heavy}"


def test_local_pipeline_shape(migrated_airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    dag = bag.get_dag("tpu_llm_pipeline_local")
    assert dag is not None
    assert dag.catchup is False and dag.max_active_runs == 1 and dag.schedule is not None
    order = [
        "check_params",
        "budget_guard",
        "approve_budget",  # a run over its budget may wait for a person: before the lease, holding nothing
        "acquire_slice",
        "start_cluster",
        "prep",
        *TRAIN_TO_REPORT,
        "serve_until_idle",  # a kept endpoint with idle_timeout waits here (deferred) until it is idle
        "stop_cluster",
        "release_slice",
    ]
    for up, down in zip(order, order[1:], strict=False):
        assert down in dag.get_task(up).downstream_task_ids
    assert dag.get_task("stop_cluster").keep == KEEP_AFTER_WATCH
    start, stop = dag.get_task("start_cluster"), dag.get_task("stop_cluster")
    assert start.is_setup and stop.is_teardown
    # the evaluation runs on the slice it trained on: its workers answer the held-out set after the last
    # step, and the train task gates on what they report
    train = dag.get_task("train")
    assert "evaluate" not in dag.task_ids and train.train_loop_config["heldout"].endswith("/data/heldout")
    assert train.min_result == {"evaluation.accuracy": "{{ params.accuracy_threshold }}"}
    # A slice lease spans the cluster's life, so a backfill (own max_active_runs) never holds two slices.
    assert dag.get_task("acquire_slice").is_setup and dag.get_task("release_slice").is_teardown
    assert set(dag.params) >= {
        "accelerator",
        "topology",
        "framework",
        "train_steps",
        "resume",
        "accuracy_threshold",
        "keep_endpoint",
        "idle_timeout",
    }
    assert dag.params["resume"] == "auto" and dag.get_task("train").resume == "{{ params.resume }}"


def test_local_pipeline_records_its_ledger_and_checks_its_budget(migrated_airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS / "tpu_llm_pipeline_local.py")).get_dag("tpu_llm_pipeline_local")
    ledger = dag.get_task("chip_ledger")
    # after the cluster is stopped (its span is stop_cluster's XCom), whatever failed, without deciding the run
    assert ledger.is_teardown and "stop_cluster" in ledger.upstream_task_ids
    assert ledger.slices[0]["task_id"] == "stop_cluster"
    guard = dag.get_task("budget_guard")
    assert "check_params" in guard.upstream_task_ids and guard.downstream_task_ids == {"approve_budget"}
    assert dag.get_task("approve_budget").downstream_task_ids == {"acquire_slice"}  # then the lease, then start
    assert "max_chip_hours" in dag.params


def test_reaper_dag_runs_hourly_with_one_task(migrated_airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "tpuflow_reaper.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag("tpuflow_reaper")
    assert dag.schedule == "@hourly" and dag.catchup is False and dag.max_active_runs == 1
    assert [t.task_id for t in dag.tasks] == ["reap"]
    assert {"older_than", "dry_run", "dag_ids"} <= set(dag.params)
    # no list of DAG ids to keep up to date: every tpu_pipeline DAG's runs record themselves (tpuflow.slices.supervision)
    assert dag.params["dag_ids"] == []
    assert dag.get_task("reap").output_root == "{{ var.value.get('tpuflow_gke_output_root', '') }}"


@pytest.mark.parametrize(
    ("dag_id", "serving"),
    [
        ("tpu_llm_pipeline_local", ["start_cluster"]),  # the endpoint is served from the training slice
        ("tpu_llm_pipeline_gke", ["create_serve_node_pool", "deploy"]),
    ],
)
def test_what_serves_a_watched_endpoint_carries_no_expiry(migrated_airflow_db, dag_id: str, serving: list[str]):
    """keep_endpoint (always with an idle_timeout, the admin's cap when empty): the watch vouches for the endpoint
    while its run runs, so the reaper judges what serves it by the run alone (no 24 h expiry); any other run keeps
    the default expiry."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py")).get_dag(dag_id)
    env = dag.get_template_env(force_sandboxed=False)
    day = 24 * 3600
    for params, expected in [
        ({"keep_endpoint": True, "idle_timeout": 15}, None),
        ({"keep_endpoint": True, "idle_timeout": 0.1}, None),
        # empty or 0: still watched, for the admin's idle cap (tpuflow.limits): no kept-until-deleted endpoint
        ({"keep_endpoint": True, "idle_timeout": None}, None),
        ({"keep_endpoint": True, "idle_timeout": 0}, None),
        ({"keep_endpoint": False, "idle_timeout": 15}, day),
    ]:
        for task_id in serving:
            task = dag.get_task(task_id)
            rendered = task.render_template(task.expires_after, {"params": params}, jinja_env=env)
            assert rendered == expected, (task_id, params, rendered)
    if dag_id.endswith("gke"):  # the training slice is never the endpoint's: always its expiry
        assert dag.get_task("create_node_pool").expires_after == timedelta(hours=24)
