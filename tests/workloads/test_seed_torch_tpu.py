"""Seed 004's FSDP2 TorchTrainer (examples/workloads/seed_torch_finetune/train.py) submitted as a Ray job to a
simulated v6e 2x2 (one 4-chip host): ScalingConfig(use_tpu=True, topology, accelerator_type,
resources_per_worker={"TPU": 1}) and TorchConfig(backend="tpu_dist") as the seed wrote them, through
Ray's own TPU torch path with tpuflow's CPU stand-in for torch_tpu: model, batches and loss on the
``tpu`` device."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from support.ray_cluster import run_job, running_cluster

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
SCRIPT_DIR = WORKLOADS.parent / "examples" / "workloads" / "seed_torch_finetune"
STAND_IN = WORKLOADS / "simulated_tpu" / "torch_tpu"

pytestmark = pytest.mark.slow  # a cluster plus four FSDP2 workers (about 50 s): the example runs in make test


@pytest.mark.parametrize(
    ("topology", "machine_type", "workers"),
    [
        pytest.param("2x2", None, 4, id="v6e 2x2, one host"),
        # eight workers on two simulated hosts, ~140 s on 2 cores (CI time): make test runs the one-host case
        pytest.param("2x4", "ct6e-standard-4t", 8, id="v6e 2x4, two hosts", marks=pytest.mark.long),
    ],
)
def test_seed_torch_trainer_runs_on_rays_tpu_path(
    tmp_path: Path, topology: str, machine_type: str | None, workers: int
) -> None:
    """On the two-host 2x4 too: Ray Train sets each worker's rank itself, so Ray's misreading of the shape (one
    8-chip host) does not reach the script's process group."""
    args = (
        f"train.py --topology {topology} --accelerator-type TPU-V6E --num-workers {workers} --num-epochs 3 "
        f"--num-samples 256 --run-name seed-fsdp2 --storage-path {tmp_path / 'runs'}"
    )
    runtime_env = {
        "working_dir": str(SCRIPT_DIR),
        # the local cluster will carry the stand-in on every process's path; the test does not rely on it
        "py_modules": [str(STAND_IN)],
        "env_vars": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"},
    }
    name = f"seed-{uuid.uuid4().hex[:6]}"
    with running_cluster(
        name, tmp_path / "clusters", topology=topology, machine_type=machine_type, host_cpus=4
    ) as cluster:
        logs = run_job(cluster, args, runtime_env, timeout=900)

    line = [ln for ln in logs.splitlines() if ln.startswith("TPUFLOW_RESULT ")][-1]
    result = json.loads(line.removeprefix("TPUFLOW_RESULT "))
    metrics = result["metrics"]
    # rank 0's loss lived on Ray's TPUTorchDeviceManager device, all-reduced over tpu_dist
    assert (metrics["world_size"], metrics["loss_device"]) == (workers, "tpu")
    # rank 0's line per epoch (Ray may echo a worker's line twice into the job log)
    losses = {int(e): float(x) for e, x in re.findall(r"Epoch (\d+)/3 \| loss=([0-9.]+)", logs)}
    assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1], logs[-4000:]
    assert Path(result["checkpoint"], "model.pt").is_file()
