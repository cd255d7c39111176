"""The driver as a Ray job on the local launcher's simulated TPU slice (operators/tpuflow/local/cluster.py):
JaxTrainer(use_tpu=True) on a v6e 2x4 built from two 4-chip hosts, from the catalog's scaling config."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from support.ray_cluster import run_job
from tpuflow_driver.result import parse_result

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
pytestmark = pytest.mark.slow


@pytest.mark.long  # make test trains on simulated slices in tests/workloads/test_multislice.py and the demo runs
def test_driver_job_on_simulated_v6e_2x4(v6e_2x4: Any, prepared: dict[str, Any], tmp_path: Path) -> None:
    cluster, tpu = v6e_2x4
    spec = {
        "framework": "jax",
        "train_loop": "addition.train_jax:train_loop_per_worker",
        "train_loop_config": {"num_steps": 120, "checkpoint_every": 60, "log_every": 20},
        "scaling_config": tpu.scaling_config(),
        "run_name": "slice-run",
        "storage_path": str(tmp_path / "runs"),
        "datasets": {"train": prepared["train_path"]},
        "worker_env": {"JAX_PLATFORMS": "cpu"},
    }
    logs = run_job(
        cluster,
        f"-m tpuflow_driver.train --spec-json {shlex.quote(json.dumps(spec))}",
        {"working_dir": str(WORKLOADS), "env_vars": {"JAX_PLATFORMS": "cpu"}},
        timeout=420,
    )
    result = parse_result(logs)
    assert result is not None, logs[-4000:]
    m = result["metrics"]
    assert (m["step"], m["world_size"], m["replicas_in_sync"]) == (120, 2, True)
    # JaxTrainer(use_tpu=True) initialised jax.distributed itself: one JAX job over both hosts
    assert "2 worker(s), 2 JAX device(s) (cpu)" in logs
    assert Path(result["checkpoint"], "meta.json").exists()
