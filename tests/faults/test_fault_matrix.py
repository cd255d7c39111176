"""Each (stage, fault) of the GKE pipeline on the stand-ins, of the local pipeline on real local Ray
clusters, and of the local pipeline in a running Airflow (REST API, triggerer, scheduler): the stage recovers
where the fault is transient, fails with a reason where it is not, and either way the run leaves nothing
behind and makes nothing twice (a deleted run: once `tpuflow reap` ran). In the local rows each task submits
its Ray job once (a retry re-attaches), and the infrastructure faults (a TPU host preempted mid-training, GCS
503/429 on the outputs' writes) must recover, a row whose fault never fired failing.

`make test` runs one case of each kind; `make faults` runs them all (tests/faults/matrix.py,
tests/faults/local_matrix.py, tests/faults/airflow_matrix.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.airflow_matrix import RUN_TIMEOUT, AirflowFaultCase, airflow_case_params, run_airflow_case
from faults.controlplane_matrix import ControlPlaneFaultCase, control_plane_case_params, run_control_plane_case
from faults.local_matrix import LocalFaultCase, local_case_params, run_local_case
from faults.matrix import OUTCOMES, FaultCase, case_params, run_case

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", case_params())
def test_fault_leaves_nothing_behind(
    case: FaultCase, dags_folder: Path, gke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_case(case, dags_folder, gke, tmp_path, monkeypatch)
    OUTCOMES.append(outcome)
    assert not outcome.leaked, outcome.row()
    assert not outcome.duplicated, outcome.row()
    assert outcome.recovered == case.recovers, outcome.row()
    if case.zones:  # the slice landed in the last zone, after one create in each zone before it
        assert outcome.explanation == f"landed in {case.zones[-1]} after creates in {', '.join(case.zones)}"
    if case.reclaimed:  # billed while the nodes ran, not until the teardown deleted the pool GKE had emptied
        train = outcome.ledger["slices"][0] if outcome.ledger else {}
        assert train.get("reclaimed_at") and train["deleted_at"] > train["reclaimed_at"], (outcome.row(), train)
        assert train["seconds"] == pytest.approx(train["reclaimed_at"] - train["created_at"], abs=0.01), train
    if case.patch_dag is not None:  # the task failed after its create (raised, or timed out): it made one
        made = (
            outcome.made.get("node_pools", 0)
            if case.stage.endswith("node_pool")
            else outcome.made.get(f"raycluster:{case.stage}", 0)
        )
        assert made == 1, (outcome.row(), outcome.made)


@pytest.mark.parametrize("case", local_case_params())
def test_local_fault_leaves_nothing_behind(
    case: LocalFaultCase, dags_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_local_case(case, dags_folder, tmp_path, monkeypatch)
    OUTCOMES.append(outcome)
    assert not outcome.leaked, outcome.row()
    assert not outcome.duplicated, outcome.row()
    assert outcome.recovered == case.recovers, f"{outcome.row()}\n{outcome.explanation}"
    assert outcome.made["local_clusters"] == 1, (outcome.row(), outcome.made)  # it ran: the fault hit real work
    # a retry re-attaches to its task's job, and Ray Train recovers a lost host inside its job: one job per task
    jobs = {task: n for task, n in outcome.made.items() if task.startswith("ray_jobs:")}
    assert set(jobs.values()) <= {1}, (outcome.row(), jobs)
    if case.during is not None:  # a fault that never fired proves nothing
        assert outcome.made["faults_fired"], f"{outcome.row()}\n{outcome.explanation}"


@pytest.fixture(scope="module")
def unpaused_pipeline(api: Any) -> None:
    from support.real_airflow import PIPELINE

    api.patch(f"/dags/{PIPELINE}", json={"is_paused": False}).raise_for_status()


@pytest.mark.parametrize("case", airflow_case_params())
@pytest.mark.timeout(RUN_TIMEOUT + 900)  # one pipeline run, a service restart or the reaper
def test_airflow_fault_leaves_nothing_behind(
    case: AirflowFaultCase, services: Any, api: Any, unpaused_pipeline: None
) -> None:
    outcome = run_airflow_case(case, services, api)
    OUTCOMES.append(outcome)
    if case.reaped:  # nothing of the run tore down: the reaper found its cluster and its lease
        assert outcome.made == {"local_cluster": 1, "lease": 1}, f"{outcome.row()}\n{outcome.explanation}"
    assert not outcome.leaked, f"{outcome.row()}\n{outcome.explanation}"
    assert not outcome.duplicated, f"{outcome.row()}\n{outcome.explanation}"
    assert outcome.recovered == case.recovers, f"{outcome.row()}\n{outcome.explanation}"


@pytest.fixture(scope="module")
def real_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real control plane (tpuflow_rehearsal.rehearsal), shared by the control-plane rows."""
    from tpuflow_rehearsal.nodes import network as net
    from tpuflow_rehearsal.rehearsal import RehearsalStack

    if net.available() is not None:
        pytest.skip(str(net.available()))
    with RehearsalStack(tmp_path_factory.mktemp("real-plane"), operation_seconds=1) as stack:
        yield stack


@pytest.mark.parametrize("case", control_plane_case_params())
def test_control_plane_fault_leaves_nothing_behind(
    case: ControlPlaneFaultCase, real_plane: Any, dags_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_control_plane_case(case, real_plane, dags_folder, monkeypatch)
    OUTCOMES.append(outcome)
    said = f"{outcome.row()}\n{outcome.explanation}"
    assert "never fired" not in outcome.explanation, said
    assert not outcome.leaked, said
    assert not outcome.duplicated, said
    assert outcome.recovered == case.recovers, said
    assert outcome.made == {"node_pools": 1, "rayclusters": 1}, said  # the fault hit real work, made once
