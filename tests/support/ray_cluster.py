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


SLICE_LABEL = "ray.io/tpu-slice-name"


def alive_actors(cluster: Any, class_name: str) -> list[dict[str, Any]]:
    """The cluster's live actors whose class name contains ``class_name`` (the dashboard's state API)."""
    import requests

    resp = requests.get(
        f"{cluster.dashboard_url}/api/v0/actors",
        params={"detail": "1", "limit": "1000"},
        headers=cluster.auth_headers(),
        timeout=30,
    )
    resp.raise_for_status()
    actors = resp.json()["data"]["result"]["result"]
    return [a for a in actors if a.get("state") == "ALIVE" and class_name in str(a.get("class_name"))]


def slice_of_node(cluster: Any) -> dict[str, str]:
    """Node id -> the name of the slice the node is a host of ("" for the head)."""
    return {n["node_id"]: (n.get("labels") or {}).get(SLICE_LABEL, "") for n in cluster.nodes_summary()}


def slice_index(cluster: Any, slice_name: str) -> int:
    """The index ``kill_host`` / ``preempt_host`` take for the slice named ``slice_name``."""
    return sorted({s for s in slice_of_node(cluster).values() if s}).index(slice_name)


def submit_job(cluster: Any, args: str, runtime_env: dict[str, Any]) -> tuple[Any, str]:
    """Submit ``python ARGS`` to the cluster through Ray's JobSubmissionClient; returns (client, submission id).

    The interpreter is this one: the cluster inherits the PATH of whoever started it, which need not lead here."""
    import shlex
    import sys

    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url, headers=cluster.auth_headers())
    return client, client.submit_job(entrypoint=f"{shlex.quote(sys.executable)} {args}", runtime_env=runtime_env)


def run_job(cluster: Any, args: str, runtime_env: dict[str, Any], timeout: float = 600.0) -> str:
    """``submit_job``, then wait for the job to succeed; returns its logs."""
    import time

    from ray.job_submission import JobStatus

    client, job = submit_job(cluster, args, runtime_env)
    deadline = time.time() + timeout
    while (status := client.get_job_status(job)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.time() < deadline, f"job {job} still {status}"
        time.sleep(1)
    logs = client.get_job_logs(job)
    assert status == JobStatus.SUCCEEDED, logs[-4000:]
    return logs
