"""The one way the tests start a simulated-TPU Ray cluster with tpuflow's launcher, and stop it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def running_cluster(
    name: str,
    base_dir: Path,
    accelerator: str = "TPU-V6E",
    topology: str = "2x2",
    machine_type: str | None = None,
    num_slices: int = 1,
    **start_kwargs: Any,
) -> Iterator[Any]:
    """A LocalRayCluster on a simulated slice, started under ``base_dir`` (600 s to come up, two head
    CPUs unless ``start_kwargs`` say otherwise); on exit it is stopped, and no process started for it
    may outlive the stop."""
    from tpuflow.local.cluster import LocalRayCluster, _pids_referencing
    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec(accelerator, topology, machine_type, num_slices=num_slices)
    cluster = LocalRayCluster.start(tpu, name, base_dir, **{"head_cpus": 2, "timeout": 600, **start_kwargs})
    try:
        yield cluster
    finally:
        cluster.stop()
        assert _pids_referencing(cluster.temp_dir) == [], f"processes of the test cluster {name} outlived stop()"
