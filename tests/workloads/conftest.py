"""Fixtures for the workload tests: workloads/ on sys.path (as the Ray job's working_dir puts
it), one in-process local Ray cluster per session, prepared data, one trained model, and one
simulated v6e 2x4 slice (two 4-chip hosts) for the tests that need a real multi-host slice."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.ray_in_process import in_process_ray

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
if str(WORKLOADS) not in sys.path:
    sys.path.insert(0, str(WORKLOADS))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

DATE = "2026-01-01"


@pytest.fixture(scope="session")
def ray_local() -> Iterator[dict[str, Any]]:
    """A private local Ray cluster for this test session (support.ray_in_process)."""
    # 4 logical CPUs on a 2-core machine: two train workers hold one each and Ray Data's
    # read tasks need CPUs of their own, or ingest waits forever.
    with in_process_ray(num_cpus=4, prefix="tfw-") as cluster:
        yield cluster


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
