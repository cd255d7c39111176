"""Ray jobs with gs:// storage against the emulator, on one simulated v6e 2x2 slice: prep's parquet
and Ray Train's checkpoints under injected transient faults. (The preemption drill resuming from the
bucket's latest checkpoint is tests/rayjob/test_preemption.py, in make test.)"""

from __future__ import annotations

import json

import pytest
from support.fault_proxy import FaultProxy, Rule, writes_to
from support.gcs_bucket import list_bucket
from support.workload_operators import addition_prep, addition_train

from tpuflow.storage import read_text

# Fault-injected training on gs:// (about 5 minutes on 2 cores): `make test-long`.
pytestmark = [pytest.mark.slow, pytest.mark.long]
SLICE = {"accelerator": "TPU-V6E", "topology": "2x2"}


def _checkpoints(bucket: str, prefix: str) -> dict[str, int]:
    """checkpoint folder -> step, from each checkpoint's meta.json in the bucket."""
    found = {}
    for name in list_bucket(bucket, prefix):
        if name.endswith("/meta.json"):
            folder = name.rsplit("/", 1)[0]
            found[folder] = json.loads(read_text(f"gs://{bucket}/{name}"))["step"]
    return found


def test_parquet_and_checkpoints_survive_transient_gcs_errors(
    small_cluster, fresh_context, bucket, gcs_emulator, emulator_at
):
    proxy = FaultProxy(gcs_emulator.url).start()
    emulator_at(proxy.url)  # the jobs' STORAGE_EMULATOR_HOST comes from here (runtime_env env_vars)
    try:
        info = small_cluster.connection_info()
        data = f"gs://{bucket}/run/data"
        proxy.add(Rule(503, writes_to(".parquet"), every=2, limit=3))
        proxy.add(Rule("reset", writes_to(".parquet"), every=3, limit=2))
        prepped = addition_prep(info, data, num_train=2000).execute(fresh_context("prep"))
        assert prepped["train_rows"] == 2000 and prepped["heldout_rows"] == 200
        parquet_faults = len(proxy.injected)
        assert parquet_faults >= 3, proxy.injected

        proxy.clear()
        proxy.add(Rule(503, writes_to("checkpoint_"), every=3, limit=4))
        proxy.add(Rule(429, writes_to("checkpoint_"), every=5, limit=2))
        proxy.add(Rule("reset", writes_to("checkpoint_"), every=7, limit=2))
        config = {"num_steps": 150, "checkpoint_every": 50, "log_every": 25}
        train = addition_train(info, SLICE, data, f"gs://{bucket}/run/train", "faults", train_loop_config=config)
        result = train.execute(fresh_context("train"))
        checkpoint_faults = proxy.injected[parquet_faults:]
        assert len(checkpoint_faults) >= 4, checkpoint_faults
    finally:
        proxy.stop()
        emulator_at(gcs_emulator.url)
    # No checkpoint lost: one per interval, each complete, the last one the result.
    assert result["checkpoint"].startswith(f"gs://{bucket}/run/train/faults/checkpoint_")
    steps = _checkpoints(bucket, "run/train/faults/")
    assert sorted(steps.values()) == [50, 100, 150], steps
    for folder in steps:
        assert f"{folder}/params.npz" in list_bucket(bucket, folder)
    assert steps[result["checkpoint"][len(f"gs://{bucket}/") :]] == 150
