"""Each (stage, fault) of the GKE pipeline on the stand-ins: the stage recovers where the fault is transient,
fails with a reason where it is not, and either way the run leaves nothing behind and makes nothing twice.

`make test` runs the first case of each stage; `make faults` runs them all (tests/faults/matrix.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
