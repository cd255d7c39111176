"""A private local Ray cluster started inside the test process with ``ray.init`` (the workload tests, a
Serve app), as the Ray job's working_dir would run workloads/."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"

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


@contextmanager
def in_process_ray(num_cpus: int, prefix: str) -> Iterator[dict[str, Any]]:
    """``ray.init`` of a new cluster of ``num_cpus`` logical CPUs with workloads/ as its working_dir, under
    RAY_ENV (never attached to someone else's cluster through RAY_ADDRESS); yields its GCS address and temp
    dir. On exit Ray is shut down (never `ray stop`: it kills other clusters), the temp dir removed and the
    environment restored."""
    import ray

    saved = {k: os.environ.get(k) for k in [*RAY_ENV, "RAY_ADDRESS"]}
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.update(RAY_ENV)
    temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: Ray's socket paths are length-limited
    try:
        ctx = ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp_dir,
            runtime_env={"working_dir": str(WORKLOADS), "env_vars": {"JAX_PLATFORMS": "cpu"}},
            logging_level="WARNING",
        )
        yield {"address": ctx.address_info["gcs_address"], "temp_dir": temp_dir}
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
