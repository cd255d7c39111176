"""Each (stage, fault) of the GKE pipeline on the stand-ins, and of the local pipeline on real local Ray
clusters: the stage recovers where the fault is transient, fails with a reason where it is not, and
either way the run leaves nothing behind and makes nothing twice.

`make test` runs one case of each kind; `make faults` runs them all (tests/faults/matrix.py,
tests/faults/local_matrix.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
    if case.patch_dag is not None:  # the task raised after its create: there was something to clean up
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
    assert outcome.recovered == case.recovers, outcome.row()
    assert outcome.made["local_clusters"] == 1, (outcome.row(), outcome.made)  # it ran: the fault hit real work
