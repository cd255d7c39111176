"""Two simulated v6e 2x4 slices (two 4-chip hosts each; the session's slice_cluster): the slice preflight
through its operator (passing, then failing on a host made unreachable for collectives, naming it), and
JaxTrainer across both slices (one worker per host of every slice, the slice identity and multi-slice
environment Ray Train set on each worker), through a host of one slice preempted mid-training."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from support.airflow_context import task_context
from support.ray_cluster import run_job
from tpuflow_driver.result import parse_result

from tpuflow.local.cluster import host_ip

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_slices(slice_cluster: Any) -> Any:
    """The session's cluster of two v6e 2x4 slices (tests/conftest.py)."""
    return slice_cluster


def _preflight(cluster: Any, **kw: Any) -> Any:
    from tpuflow.rayjob.preflight import RaySlicePreflightOperator

    return RaySlicePreflightOperator(
        task_id="preflight",
        cluster=cluster.connection_info(),
        tpu_slice={"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t", "num_slices": 2},
        deferrable=False,
        poll_interval=0.5,
        **kw,
    )


def test_preflight_passes_on_two_healthy_slices(two_slices: Any) -> None:
    t = time.perf_counter()
    result = _preflight(two_slices, deadline_s=60).execute(task_context(task_id="preflight"))
    print(f"preflight passed in {time.perf_counter() - t:.1f}s: {result}")
    assert result["ok"] and result["num_slices"] == 2 and len(result["hosts"]) == 4
    # one JAX CPU device per simulated host (a real v6e host has 4): every rank saw 1 + 2 + 3 + 4
    assert result["devices"] == 4 and result["expected_sum"] == 10
    # the all-reduce ran as one multi-slice group: MEGASCALE_SLICE_ID by rank, as JaxTrainer sets it
    assert result["megascale_slice_ids"] == ["0", "0", "1", "1"]
    # each slice's bundles land on that slice's two hosts
    slices = [h.split("/")[0] for h in result["hosts"]]
    assert slices[0] == slices[1] != slices[2] == slices[3]


def test_preflight_fails_naming_the_host_that_cannot_reach_the_others(two_slices: Any) -> None:
    host = two_slices.set_unreachable(1, 1)
    try:
        t = time.perf_counter()
        with pytest.raises(AirflowFailException) as err:
            _preflight(two_slices, deadline_s=10).execute(task_context(task_id="preflight-bad"))
        print(f"preflight failed in {time.perf_counter() - t:.1f}s: {err.value}")
    finally:
        two_slices.set_unreachable(1, 1, False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("slice preflight failed: 1 of 4 host(s) did not answer the roll call within 10s: ")
    assert message.endswith(f"{host} ({host_ip(1, 1, 2)})")  # the host's own address


@pytest.mark.long  # ~4 min; make test keeps the one-slice preemption drill (tests/rayjob/test_preemption.py)
@pytest.mark.timeout(1200)
def test_jax_trains_across_two_slices_and_a_host_lost_in_one_restarts_both_from_a_checkpoint(
    two_slices: Any, tmp_path: Path
) -> None:
    """JaxTrainer across both slices, one worker per host of every slice, each with its slice identity and the
    multi-slice environment Ray Train set; one host of slice 1 is preempted (and comes back): the whole group,
    both slices, restarts from the latest checkpoint (a slice cannot run short of a host), the driver log
    names the slice and host lost, and training finishes with 4 workers, 2 per slice, never mixed."""
    from ray.job_submission import JobStatus
    from support.ray_cluster import alive_actors, slice_of_node, submit_job

    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t", num_slices=2)
    # Ray Train gives a restarting worker group 60 s to start; on a busy 2-core machine the replaced host's
    # four new workers can take longer, which Ray counts as one more failure
    env_vars = {"JAX_PLATFORMS": "cpu", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "300"}
    env = {"working_dir": str(WORKLOADS), "env_vars": env_vars}
    data = tmp_path / "data"
    run_job(two_slices, f"-m addition.prep --output-dir {data} --date 2026-01-01 --num-train 2000", env)
    every, steps = 50, 400
    spec = {
        "framework": "jax",
        "train_loop": "addition.train_jax:train_loop_per_worker",
        "train_loop_config": {"num_steps": steps, "checkpoint_every": every, "log_every": 10},
        "scaling_config": tpu.scaling_config(),
        "run_name": "two-slices-preempted",
        "storage_path": str(tmp_path / "runs"),
        "datasets": {"train": str(data / "train")},
        "worker_env": {"JAX_PLATFORMS": "cpu"},
        "max_failures": 2,
    }
    client, job = submit_job(two_slices, f"-m tpuflow_driver.train --spec-json {shlex.quote(json.dumps(spec))}", env)
    lost = None
    deadline = time.time() + 900
    try:
        while time.time() < deadline and client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED}:
            done = [int(s) for s in re.findall(r"\[train_jax\] step (\d+)/", client.get_job_logs(job))]
            if lost is None and done and max(done) >= every + 20:
                nodes = slice_of_node(two_slices)
                slices = {nodes[a["node_id"]] for a in alive_actors(two_slices, "RayTrainWorker")}
                assert len(slices) == 2, "the trainer runs on both slices"
                lost = two_slices.preempt_host(1, 1, restart_after=2)
            time.sleep(1)
    finally:  # the session's slices must not stay reserved by a job this test gave up on
        if client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
            client.stop_job(job)
    logs = client.get_job_logs(job)
    assert client.get_job_status(job) == JobStatus.SUCCEEDED, logs[-4000:]
    assert lost is not None, "training ended before a host could be preempted"
    result = parse_result(logs)
    assert f"[driver] slice {two_slices.name}-slice-1 lost its host worker 1" in logs, logs[-4000:]
    assert {"slice": f"{two_slices.name}-slice-1", "worker": "1"} in result["hosts_lost"], result["hosts_lost"]
    resumed = [int(s) for s in re.findall(r"resumed from checkpoint \S+ at step (\d+)", logs)]
    # the group (both slices: one mesh, one world of 4) went on from a checkpoint, not from step 0
    assert resumed and min(resumed) >= every, logs[-4000:]
    metrics = result["metrics"]
    assert result["resumed"] is True and metrics["resumed_from"], metrics
    assert (metrics["step"], metrics["world_size"], metrics["replicas_in_sync"]) == (steps, 4, True)
    assert metrics["num_slices"] == 2
    workers = metrics["workers"]
    by_slice: dict[str, list[dict[str, Any]]] = {}
    for w in workers:
        by_slice.setdefault(w["slice_name"], []).append(w)
    # 4 workers, 2 per slice, never mixed: each slice's workers are its two hosts and share one MEGASCALE_SLICE_ID
    assert sorted(by_slice) == [f"{two_slices.name}-slice-0", f"{two_slices.name}-slice-1"]
    for members in by_slice.values():
        assert sorted(w["tpu_worker_id"] for w in members) == [0, 1]
        assert len({w["megascale_slice_id"] for w in members}) == 1
    assert sorted({w["megascale_slice_id"] for w in workers}) == [0, 1]
    assert {w["megascale_num_slices"] for w in workers} == {2}
    assert "data parallel across 2 slices, one mesh over all 4 devices" in logs
