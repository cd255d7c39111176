"""A task instance double that also sees other tasks' XComs (the ledger, the budget guard and the
budgeted train task read the create tasks' pool names and the previous run's ledger), and what the reaper tests
make: node pool bodies, local cluster states with dead or live processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.airflow_context import FakeTaskInstance
from support.gke_standin import ZONE

from tpuflow.naming import TaskIdentity


@dataclass
class RunTaskInstance(FakeTaskInstance):
    """FakeTaskInstance of one DAG run whose other tasks' XComs are given as {(task_id, key): value}."""

    others: dict[tuple[str, str], Any] = field(default_factory=dict)
    prior: dict[str, Any] = field(default_factory=dict)  # task_id -> a previous run's return value

    def xcom_pull(  # type: ignore[override]
        self, task_ids: str | None = None, key: str = "return_value", include_prior_dates: bool = False
    ) -> Any:
        if task_ids in (None, self.task_id):
            return self.xcoms.get(key)
        if (task_ids, key) in self.others:
            return self.others[(task_ids, key)]
        return self.prior.get(task_ids) if include_prior_dates else None


def pool_body(name: str, labels: dict[str, str] | None) -> dict[str, Any]:
    config: dict[str, Any] = {"machineType": "ct6e-standard-1t"}
    if labels is not None:
        config["resourceLabels"] = labels
    return {"nodePool": {"name": name, "config": config, "initialNodeCount": 1, "locations": [ZONE]}}


# the start task of a killed run of the local pipeline: the owner its dead cluster's state records
LOCAL_OWNER = TaskIdentity("tpu_llm_pipeline_local", "scheduled__2026-11-30T00:00:00+00:00", "start_cluster")


def dead_local_cluster(base: Path, name: str, owner: dict[str, Any] | None = None) -> Path:
    """A local cluster's state whose Ray processes are gone (its run was killed -9, nothing stopped it);
    ``owner`` the record its state holds (default LOCAL_OWNER's)."""
    from tpuflow.local.cluster import LocalRayCluster, NodeProcess

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    state_dir = base / name
    state_dir.mkdir(parents=True)
    cluster = LocalRayCluster(
        name=name, state_dir=str(state_dir), temp_dir=str(base / "tmp-gone"), gcs_address="127.0.0.1:1",
        dashboard_url="http://127.0.0.1:1", serve_port=1, slice=None,
        nodes=[NodeProcess(role="head", pid=finished.pid, log="")], started_at=time.time() - 7200,
        owner=LOCAL_OWNER.record() if owner is None else owner,
    )  # fmt: skip
    cluster.save()
    return state_dir


@contextlib.contextmanager
def live_head(temp_dir: Path) -> Iterator[int]:
    """A live local cluster head: a process in its own group that names the cluster's temp dir (as Ray's do)."""
    temp_dir.mkdir(parents=True, exist_ok=True)
    head = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", str(temp_dir)],
        start_new_session=True,
        env={**os.environ, "TPUFLOW_LOCAL_CLUSTER": str(temp_dir)},
    )
    try:
        yield head.pid
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
