"""Fixtures for the workload tests: workloads/ on sys.path (as the Ray job's working_dir puts
it), one in-process local Ray cluster per session, prepared data, one trained model, and one
simulated v6e 2x4 slice (two 4-chip hosts) for the tests that need a real multi-host slice."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
if str(WORKLOADS) not in sys.path:
    sys.path.insert(0, str(WORKLOADS))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

DATE = "2026-01-01"

# RAY_AUTH_MODE: a local cluster with token auth can hang drivers that connect to it;
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray on loopback.
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "JAX_PLATFORMS": "cpu",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def ray_local() -> Iterator[dict[str, Any]]:
    """A private local Ray cluster for this test session (never `ray stop`: it kills other clusters)."""
    import ray

    saved = {k: os.environ.get(k) for k in [*RAY_ENV, "RAY_ADDRESS"]}
    os.environ.pop("RAY_ADDRESS", None)  # never attach to someone else's cluster
    os.environ.update(RAY_ENV)
    temp_dir = tempfile.mkdtemp(prefix="tfw-", dir="/tmp")  # short: Ray's socket paths are length-limited
    # 4 logical CPUs on a 2-core machine: two train workers hold one each and Ray Data's
    # read tasks need CPUs of their own, or ingest waits forever.
    ctx = ray.init(
        num_cpus=4,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp_dir,
        runtime_env={"working_dir": str(WORKLOADS), "env_vars": {"JAX_PLATFORMS": "cpu"}},
        logging_level="WARNING",
    )
    try:
        yield {"address": ctx.address_info["gcs_address"], "temp_dir": temp_dir}
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def prepared(ray_local: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The demo's data for DATE, written by the prep entrypoint through Ray Data."""
    from addition import prep

    out = tmp_path_factory.mktemp("data") / DATE
    return prep.run(prep.parse_args(["--output-dir", str(out), "--date", DATE]))


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One in-process JAX training run with the product defaults, saved as a checkpoint."""
    from addition import checkpoint as ckpt
    from addition import data, train_jax
    from addition.training import model_config, resolve_config

    cfg = resolve_config({})
    spec, model = model_config(cfg)
    train = data.generate(DATE, "train", data.default_num_train(spec, 200), num_heldout=200)
    params, metrics = train_jax.train_local(train["tokens"], cfg)
    directory = tmp_path_factory.mktemp("ckpt") / "jax_local"
    ckpt.save(directory, ckpt.Meta("jax", metrics["step"], metrics["epoch"], model, spec), params)
    return {
        "params": params,
        "metrics": metrics,
        "checkpoint": str(directory),
        "model": model,
        "spec": spec,
        "date": DATE,
    }


@pytest.fixture(scope="session")
def v6e_2x4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The smallest multi-host slice: v6e 2x4 as two 4-chip simulated hosts (a LocalRayCluster)."""
    from tpuflow.local.cluster import LocalRayCluster
    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec("TPU-V6E", "2x4", machine_type="ct6e-standard-4t").require(ray=True)
    base = tmp_path_factory.mktemp("clusters")
    cluster = LocalRayCluster.start(tpu, f"wl-{uuid.uuid4().hex[:6]}", base, head_cpus=2, host_cpus=1, adopt=False)
    try:
        yield cluster, tpu
    finally:
        cluster.stop()
