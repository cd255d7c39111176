"""The fault matrix's local rows: `tpu_llm_pipeline_local` (real local Ray clusters simulating the slice)
through dag.test(), with a task that raises once its work is done (the cluster started, the job ran, the
Serve app deployed, then the task failed on every try).

Counted after each run: local Ray clusters still running (a state.json left, or any process naming a
cluster's temp dir), slice leases still held, and local clusters started more than once for the run
(duplicated). The rows join the GKE rows in the table printed at the end of the session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from faults.matrix import Outcome, raises_after_its_work, settled

DAG_ID = "tpu_llm_pipeline_local"
REPO = Path(__file__).resolve().parents[2]
# A one-host slice and a short training without the accuracy gate: what a case measures is the teardown.
CONF = {
    "topology": "2x2",
    "accelerator": "TPU-V6E",
    "framework": "jax",
    "train_steps": 300,
    "num_train": 3000,
    "accuracy_threshold": 0,
}


@dataclass(frozen=True)
class LocalFaultCase:
    stage: str
    fault: str
    patch_dag: Callable[[Any], None]
    recovers: bool = False
    ci: bool = False

    pipeline = "local"

    @property
    def id(self) -> str:
        return f"local-{self.stage}-{self.fault}"


@contextmanager
def started_clusters(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every LocalRayCluster the run starts (the tasks run in this process under dag.test)."""
    from tpuflow.local.cluster import LocalRayCluster

    started: list[Any] = []
    start = LocalRayCluster.start.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, *args: Any, **kwargs: Any) -> Any:
        cluster = start(cls, *args, **kwargs)
        started.append(cluster)
        return cluster

    monkeypatch.setattr(LocalRayCluster, "start", classmethod(recording))
    yield started


@contextmanager
def local_dag_in_folder(dags_folder: Path) -> Iterator[None]:
    path = dags_folder / f"{DAG_ID}.py"
    linked = not path.exists()
    if linked:
        path.symlink_to(REPO / "dags" / f"{DAG_ID}.py")
    try:
        yield
    finally:
        if linked:
            path.unlink(missing_ok=True)


def run_local_case(case: LocalFaultCase, dags_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    from airflow.dag_processing.dagbag import DagBag
    from support.gke_pipeline import task_states

    home = tmp_path / "home"
    monkeypatch.setenv("TPUFLOW_HOME", str(home))
    monkeypatch.delenv("TPUFLOW_OUTPUT_ROOT", raising=False)  # outputs under the home
    monkeypatch.delenv("TPUFLOW_SLICE_LEASES", raising=False)  # leases under the home
    with local_dag_in_folder(dags_folder), started_clusters(monkeypatch) as started:
        bag = DagBag(dag_folder=str(dags_folder / f"{DAG_ID}.py"))
        assert bag.import_errors == {}, bag.import_errors
        dag = bag.get_dag(DAG_ID)
        for op in dag.tasks:
            if hasattr(op, "poll_interval"):
                op.poll_interval = 1.0
        case.patch_dag(dag)
        try:
            run = dag.test(run_conf=CONF)
            states = task_states(run)
        finally:
            left = _leftovers(home, started)
            for cluster in started:  # whatever the verdict, nothing stays up on the machine
                cluster.stop()
    made = {"local_clusters": len(started)}
    return Outcome(
        case,
        states.get(case.stage, "absent"),
        left,
        {"local_clusters": max(0, len(started) - 1)},
        made,
    )


def _leftovers(home: Path, started: list[Any]) -> dict[str, int]:
    from tpuflow.local.cluster import _pids_referencing

    def count() -> dict[str, int]:
        return {
            "local_clusters": len(list((home / "clusters").glob("*/state.json"))),
            "ray_processes": sum(len(_pids_referencing(c.temp_dir)) for c in started),
            "slice_leases": len(list((home / "slice-leases").rglob("slot-*.json"))),
        }

    return settled(count)


LOCAL_CASES: list[LocalFaultCase] = [
    LocalFaultCase("start_cluster", "exception-after-create", raises_after_its_work("start_cluster"), ci=True),
    LocalFaultCase("train", "exception-after-its-job", raises_after_its_work("train")),
    LocalFaultCase("deploy", "exception-after-deploy", raises_after_its_work("deploy")),
]


def local_case_params() -> list[Any]:
    return [pytest.param(case, id=case.id, marks=() if case.ci else pytest.mark.long) for case in LOCAL_CASES]
