"""The budget guard during training: the job is stopped when the ledger reaches max_chip_hours, with a
clear task failure naming the budget and Ray Train's checkpoints kept; nothing of the job runs on after the
stop (no job, no actor of it), it holds no slice lease, and the DAG's teardown then leaves no node pool
(the ledger closes); a retry after that submits nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from cost_support import RunTaskInstance
from support.airflow_context import task_context
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE
from support.ray_cluster import alive_actors, running_cluster

from tpuflow.cost.training import ChipHourBudget
from tpuflow.gke.operators import GKEDeleteNodePoolOperator
from tpuflow.naming import TaskIdentity
from tpuflow.rayjob.hooks import TERMINAL_JOB_STATES
from tpuflow.rayjob.workload_operators import RayDataPrepOperator, RayTrainOperator

# Minutes of training on purpose (the stop must come mid-training): `make test-long`. make test keeps the
# guard's refusal before anything is provisioned (tests/cost/test_budget.py).
pytestmark = [pytest.mark.slow, pytest.mark.long]
V6E_2X2 = {"generation": "v6e", "chips": 4, "num_slices": 1}
TRAINING_ALLOWED_S = 120.0  # of the budget left when the job is submitted


@pytest.fixture(scope="module")
def one_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster("pytest-budget", tmp_path_factory.mktemp("budget"), "TPU-V6E", "2x2") as cluster:
        yield cluster


def test_training_stops_at_the_budget_and_a_retry_submits_nothing(
    one_host: Any, gke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.rayjob.hooks import RayJobHook
    from tpuflow.slices.leases import lease_store

    monkeypatch.setenv("TPUFLOW_SLICE_LEASES", str(tmp_path / "leases"))  # where a lease of the run would be

    info = one_host.connection_info()
    run = {"dag_id": "budget_dag", "run_id": "manual__budget"}
    RayDataPrepOperator(
        task_id="prep", cluster=info, module="addition.prep", deferrable=False, poll_interval=0.5,
        arguments={"output_dir": str(tmp_path / "data"), "date": "2026-11-02", "num_train": 5000},
    ).execute(task_context(**run, task_id="prep"))  # fmt: skip
    # the training slice's pool exists (and bills) from its create on
    body = {"name": "train-pool", "config": {"machineType": "ct6e-standard-4t"}, "initialNodeCount": 1}
    created = time.time()
    gke.create_node_pool(PROJECT, ZONE, CLUSTER, {"nodePool": {**body, "locations": [ZONE]}})
    budget = 4 * (time.time() - created + 10 + TRAINING_ALLOWED_S) / 3600

    def train_op() -> RayTrainOperator:
        return RayTrainOperator(
            task_id="train", cluster=info, deferrable=False, poll_interval=0.5, framework="jax",
            train_loop="addition.train_jax:train_loop_per_worker", tpu_slice={"accelerator": "TPU-V6E", "topology": "2x2"},
            storage_path=str(tmp_path / "train"), run_name="budget",
            datasets={"train": str(tmp_path / "data" / "train")},
            train_loop_config={"num_steps": 100_000, "checkpoint_every": 100},
            budget=ChipHourBudget(
                max_chip_hours=budget, gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE,
                ledger_slices=[{"role": "train", "tpu": V6E_2X2, "task_id": "create_node_pool"}],
            ),
        )  # fmt: skip

    def context(try_number: int) -> dict[str, Any]:
        ti = RunTaskInstance(**run, task_id="train", try_number=try_number)
        ti.others[("create_node_pool", "node_pool_names")] = ["train-pool"]
        return task_context(ti)

    started = time.time()
    with pytest.raises(AirflowFailException, match="Training stopped: the run reached its chip-hour budget") as stop:
        train_op().execute(context(1))
    print(f"training stopped by the budget after {time.time() - started:.0f}s")
    assert f"max_chip_hours={budget}" in str(stop.value), stop.value  # the failure names the budget it hit
    hook = RayJobHook(cluster=info)
    sid = TaskIdentity(**run, task_id="train").submission_id
    deadline = time.time() + 120  # the stop is asynchronous: Ray moves the job to STOPPED shortly after
    while time.time() < deadline and hook.get_job_status(sid) != "STOPPED":
        time.sleep(1)
    jobs = hook.find_jobs(sid)
    assert [str(j.status.value if hasattr(j.status, "value") else j.status) for j in jobs] == ["STOPPED"]
    assert list((tmp_path / "train").glob("**/checkpoint_*")), "Ray Train's checkpoints are kept for a resume"
    # Nothing of the job runs on: no job on the cluster is pending or running, no actor of the stopped job
    # (the Ray Train workers that held the slice's TPU hosts) or of its supervisor is alive.
    assert [
        j.submission_id for j in hook.get_client().list_jobs() if str(j.status.value) not in TERMINAL_JOB_STATES
    ] == []
    deadline = time.time() + 60  # actors die shortly after their driver
    left = alive_of_job(one_host, jobs[0].job_id, sid)
    while left and time.time() < deadline:
        time.sleep(1)
        left = alive_of_job(one_host, jobs[0].job_id, sid)
    assert left == [], f"actors of the stopped job still alive: {left}"
    assert lease_store(None).holders(16) == {}, "a budget stop holds no slice lease"
    # a retry finds the budget spent: it fails before submitting a second job
    time.sleep(1)
    with pytest.raises(
        AirflowFailException, match=r"budget spent before training \(.*max_chip_hours=.*\); nothing submitted"
    ):
        train_op().execute(context(2))
    assert len(hook.find_jobs(jobs[0].submission_id)) == 1
    # The stop leaves the slice to the teardowns (it deletes nothing itself); the DAG's delete_node_pool then
    # leaves no pool and no workload policy, and the ledger closes (no chip billed any more).
    assert [p["name"] for p in gke.node_pools()] == ["train-pool"]
    GKEDeleteNodePoolOperator(
        task_id="delete_node_pool", node_pool_name="train-pool", project_id=PROJECT, location=ZONE,
        cluster_name=CLUSTER, gcp_conn_id=CONN_ID, poll_interval=0.1, retry_backoff=0.1,
    ).execute(task_context(**run, task_id="delete_node_pool"))  # fmt: skip
    assert gke.node_pools() == [] and gke.compute.policies() == []
    assert train_op().budget.seconds_left(context(2))[1].endswith("used by 0 chips held")


def alive_of_job(cluster: Any, job_id: str | None, submission_id: str) -> list[str]:
    """Class names of the cluster's live actors of Ray job ``job_id``, and its job supervisor's."""
    return [
        str(a.get("class_name"))
        for a in alive_actors(cluster, "")
        if (job_id and a.get("job_id") == job_id) or submission_id in str(a.get("name"))
    ]
