"""Two simulated v6e 2x4 slices (two 4-chip hosts each; the session's slice_cluster): the slice preflight
through its operator (passing, then failing on a host made unreachable for collectives, naming it), and
JaxTrainer across both slices (one worker per host of every slice, the slice identity and multi-slice
environment Ray Train set on each worker)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from support.airflow_context import task_context
from support.ray_cluster import run_job
from tpuflow_driver.result import parse_result

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
        accelerator="TPU-V6E",
        topology="2x4",
        machine_type="ct6e-standard-4t",
        num_slices=2,
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
    assert message.endswith(f"{host} (127.0.0.2)")


def test_jax_trains_across_two_slices_one_worker_per_host(two_slices: Any, tmp_path: Path) -> None:
    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t", num_slices=2)
    env = {"working_dir": str(WORKLOADS), "env_vars": {"JAX_PLATFORMS": "cpu"}}

    def run(entrypoint: str) -> str:
        return run_job(two_slices, entrypoint, env)

    data = tmp_path / "data"
    run(f"-m addition.prep --output-dir {data} --date 2026-01-01 --num-train 2000")
    spec = {
        "framework": "jax",
        "train_loop": "addition.train_jax:train_loop_per_worker",
        "train_loop_config": {"num_steps": 40, "checkpoint_every": 40, "log_every": 20},
        "scaling_config": tpu.scaling_config(),
        "run_name": "two-slices",
        "storage_path": str(tmp_path / "runs"),
        "datasets": {"train": str(data / "train")},
        "worker_env": {"JAX_PLATFORMS": "cpu"},
    }
    logs = run(f"-m tpuflow_driver.train --spec-json {shlex.quote(json.dumps(spec))}")
    metrics = parse_result(logs)["metrics"]
    assert (metrics["step"], metrics["world_size"], metrics["replicas_in_sync"]) == (40, 4, True)
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
