"""A run's local cluster as `tpuflow demo` leaves it on disk, without Ray: its 'head' a sleep in its own process
group carrying the cluster's marker (tests/cli/test_reap_cli.py, tests/slices/test_liveness_across_processes.py)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tpuflow.local.cluster import CLUSTER_ENV, LocalRayCluster, NodeProcess
from tpuflow.naming import TaskIdentity


def supervised_cluster(
    base: Path, run_id: str, supervisor: dict[str, Any] | None
) -> tuple[LocalRayCluster, subprocess.Popen]:
    """The saved cluster of DAG 'dag' run ``run_id`` under ``base``, supervised by ``supervisor``, and its head."""
    temp_dir = tempfile.mkdtemp(prefix="tpf-test-", dir="/tmp")
    head = subprocess.Popen(["sleep", "120"], start_new_session=True, env={**os.environ, CLUSTER_ENV: temp_dir})
    name = f"local-dag-{run_id}"
    cluster = LocalRayCluster(
        name=name,
        state_dir=str(base / name),
        temp_dir=temp_dir,
        gcs_address="",
        dashboard_url="",
        serve_port=0,
        slice=None,
        nodes=[NodeProcess("head", head.pid, str(base / name / "head.log"), temp_dir=temp_dir)],
        started_at=time.time(),
        owner=TaskIdentity("dag", run_id, "start_cluster").record(),
        supervisor=supervisor,
    )
    Path(cluster.state_dir).mkdir(parents=True)
    cluster.save()
    return cluster, head
