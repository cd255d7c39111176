"""The shipped hourly reaper judges every tpu_pipeline DAG of its bundle, found by the tag tpu_pipeline gives it,
not a list of DAG ids: a team's own pipeline whose finished run left a slice lease (and no supervision record:
written under another lease root, pruned, or lost) has it given back; a DAG without the tag is not the reaper's."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.airflow_context import FakeTaskInstance, task_context

from tpuflow import liveness

TEAM_DAG = textwrap.dedent(
    '''
    """Airflow DAG: a team's fine-tune, built with tpu_pipeline."""
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.dag import tpu_pipeline

    dag = tpu_pipeline("team_finetune", workload=ADDITION, backend="local")
    '''
)
UNTAGGED_DAG = textwrap.dedent(
    '''
    """Airflow DAG: something else, not tagged tpuflow."""
    from datetime import datetime

    from airflow.sdk import DAG
    from airflow.providers.standard.operators.empty import EmptyOperator

    with DAG(dag_id="other_team_etl", start_date=datetime(2026, 1, 1), schedule=None, tags=["etl"]):
        EmptyOperator(task_id="noop")
    '''
)


class BundledTaskInstance(FakeTaskInstance):
    """The reaper's task instance as the task runner gives it: with the DAG bundle its DAG was parsed from."""

    bundle_instance: Any = None


def test_the_hourly_reaper_finds_every_tagged_pipeline_dag_of_its_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.cost.operators import TPUReapOrphansOperator
    from tpuflow.slices.leases import LocalLeaseStore, default_lease_root

    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TPUFLOW_SLICE_LEASES", raising=False)
    monkeypatch.delenv(liveness.SUPERVISOR_ENV, raising=False)  # a scheduler's runs: no supervising process
    bundle = tmp_path / "dags"
    bundle.mkdir()
    (bundle / "team_finetune.py").write_text(TEAM_DAG)
    (bundle / "other_team_etl.py").write_text(UNTAGGED_DAG)
    store = LocalLeaseStore(default_lease_root())
    for holder in ("team_finetune/scheduled__2026-12-05", "other_team_etl/manual__1"):
        assert store.try_acquire(holder, 4) is not None
    finished = {"team_finetune": {"scheduled__2026-12-05": {"train": "success"}}}
    finished["other_team_etl"] = {"manual__1": {"noop": "success"}}
    ti = BundledTaskInstance(dag_id="tpuflow_reaper", task_id="reap", task_states=finished)
    ti.bundle_instance = SimpleNamespace(name="dags-folder", path=bundle)

    outcome = TPUReapOrphansOperator(task_id="reap", older_than="0s").execute(task_context(ti))

    assert [line.split(": ")[0] for line in outcome["deleted"]] == [f"lease slot 0 ({store.describe()})"], outcome
    assert [lease.holder for lease in store.all_holders().values()] == ["other_team_etl/manual__1"]
