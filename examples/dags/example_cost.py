"""Airflow DAG (example): a budget guard and an approval before anything billable, the chip-hour ledger as a
teardown, and the hourly orphan reaper.

The how-to page docs/howto/cost.md includes the marked parts. Parsing it starts nothing.
"""

from datetime import datetime

from airflow.sdk import DAG

from tpuflow.cost.approval import ChipBudgetApprovalOperator
from tpuflow.cost.local import LocalWriteChipLedgerOperator
from tpuflow.cost.operators import TPUCheckChipBudgetOperator, TPUReapOrphansOperator
from tpuflow.cost.training import ChipHourBudget
from tpuflow.local.operators import LocalRayCreateClusterOperator, LocalRayDeleteClusterOperator
from tpuflow.rayjob.workload_operators import RayTrainOperator
from tpuflow.tpu import TpuSlice

SLICE = TpuSlice.from_spec("v6e", "2x2")
OUT = "/tmp/acme/{{ dag.dag_id }}/{{ ds }}"

with DAG("example_cost", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    # [START howto_cost_budget_guard]
    guard = TPUCheckChipBudgetOperator(
        task_id="budget_guard",
        max_chip_hours=8,  # held to the admin's ceiling, the Variable tpuflow_max_chip_hours
        over_budget="ask",  # fail | ask | run, at most as loose as the Variable tpuflow_over_budget
        slices=[{"role": "train", "tpu": SLICE.to_dict(), "steps": 1000}],
        ledger_dir="/tmp/acme/{{ dag.dag_id }}",  # the previous runs' ledger.json files
    )
    approve = ChipBudgetApprovalOperator(task_id="approve_budget", guard_task_id="budget_guard", record_dir=OUT)
    # [END howto_cost_budget_guard]
    start = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=SLICE)
    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output)
    # [START howto_cost_ledger]
    ledger = LocalWriteChipLedgerOperator(
        task_id="chip_ledger",
        slices=[{"role": "train", "tpu": SLICE.to_dict(), "task_id": "start_cluster"}],
        trained=None,  # the train task's XCom, when there is one
        output_dir=OUT,
        prices="{{ var.value.get('tpuflow_chip_hour_prices', '') }}",
    )
    guard >> approve >> start >> stop.as_teardown(setups=start) >> ledger.as_teardown(setups=guard)
    # [END howto_cost_ledger]

with DAG("example_training_budget", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    # [START howto_cost_training_budget]
    RayTrainOperator(
        task_id="train",
        cluster="{{ ti.xcom_pull(task_ids='create_ray_cluster') }}",
        framework="jax",
        train_loop="acme_forecast.fit:train_loop",
        tpu_slice=SLICE,
        storage_path="gs://acme-runs/forecast/{{ ds }}/train",
        run_name="forecast",
        budget=ChipHourBudget(  # the job is stopped, its checkpoints kept, when the run's chip-hours reach 8
            max_chip_hours=8,
            ledger_slices=[{"role": "train", "tpu": SLICE.to_dict(), "task_id": "create_pool"}],
            project_id="my-project",
            location="us-east5-b",
        ),
    )
    # [END howto_cost_training_budget]

# [START howto_cost_reaper]
with DAG("example_reaper", schedule="@hourly", start_date=datetime(2026, 11, 1), catchup=False, tags=["example"]):
    TPUReapOrphansOperator(
        task_id="reap",
        older_than="2h",
        dry_run=False,
        project_id="my-project",  # empty: only local clusters and slice leases
        location="us-east5-b",
        cluster_name="tpuflow",
    )
# [END howto_cost_reaper]
