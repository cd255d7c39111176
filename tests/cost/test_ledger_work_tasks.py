"""The ledger reads the work spans of a DAG shaped unlike the demo's, through Airflow's own XComs (dag.test):
a mapped task (every map index), a task in a TaskGroup (its prefixed id), and tasks named as the user chose."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.gke_pipeline import load_dag_file

DAG_ID = "acme_ledger_shapes"
# the slice lived 1000 s; work on it: warm_up 10..60 (preflight), two map indexes 100..300 and 250..500 (data
# prep, overlapping), the grouped fit 600..900 (recorded as a plain job, named training by the slice entry)
DAG_FILE = """
import time

from airflow.sdk import DAG, TaskGroup, task

from tpuflow.cost.local import LocalWriteChipLedgerOperator
from tpuflow.work_spans import WORK_SPAN_KEY

T0 = round(time.time()) - 1000
GROUP = "featurize_and_train_the_sales_forecaster_for_every_region_of_the_quarter"


def span(ti, start, end, cause):
    ti.xcom_push(key=WORK_SPAN_KEY, value={"cause": cause, "started_at": T0 + start, "ended_at": T0 + end})


with DAG("acme_ledger_shapes", schedule=None, render_template_as_native_obj=True) as dag:

    @task(task_id="slice_lifetime")
    def lifetime():  # what a stop task records of its cluster
        return {"name": "acme-slice", "started_at": T0, "ready_at": T0 + 5, "stopped_at": T0 + 1000}

    @task(task_id="warm_up")
    def warm_up(ti=None):
        span(ti, 10, 60, "preflight")

    with TaskGroup(GROUP) as group:

        @task(task_id="shard")
        def shard(window, ti=None):
            span(ti, window[0], window[1], "data_prep")

        @task(task_id="fit")
        def fit(ti=None):
            span(ti, 600, 900, "job")

        shard.expand(window=[[100, 300], [250, 500]]) >> fit()

    ledger = LocalWriteChipLedgerOperator(
        task_id="acme_chip_ledger",
        slices=[{
            "role": "train", "tpu": {"generation": "v6e", "chips": 4}, "task_id": "slice_lifetime",
            # None: the cause the task recorded; the grouped fit is named training here
            "work": {"warm_up": None, f"{GROUP}.shard": None, f"{GROUP}.fit": "training"},
        }],
        output_dir=OUTPUT_DIR,
    )
    lifetime() >> warm_up() >> group >> ledger
"""


@pytest.fixture
def dag_file(dags_folder: Path, tmp_path: Path) -> Iterator[Path]:
    path = dags_folder / f"{DAG_ID}.py"
    path.write_text(DAG_FILE.replace("OUTPUT_DIR", repr(str(tmp_path))))
    yield path
    path.unlink()


@pytest.mark.timeout(300)
def test_mapped_and_grouped_work_tasks_all_reach_the_slice_timeline(dag_file: Path) -> None:
    run = load_dag_file(dag_file, DAG_ID, poll=0.5).test()
    assert run.state == "success"
    ledger_ti = next(ti for ti in run.get_task_instances() if ti.task_id == "acme_chip_ledger")
    (entry,) = ledger_ti.xcom_pull(task_ids="acme_chip_ledger")["slices"]
    timeline = entry["timeline"]["seconds"]
    # both map indexes (100..500, merged), the grouped task by its prefixed id, causes as recorded or named
    assert timeline["data_prep"] == pytest.approx(400, abs=0.01), timeline
    assert timeline["training"] == pytest.approx(300, abs=0.01), timeline  # no loop breakdown: not split
    assert timeline["preflight"] == pytest.approx(50, abs=0.01), timeline
    assert sum(timeline.values()) == pytest.approx(1000, abs=0.01) and entry["seconds"] == pytest.approx(1000)
