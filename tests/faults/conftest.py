"""The fault matrix's fixtures and its report: the table of every case run and the final line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.gke_pipeline import dag_in_folder, gke_standin

from faults.matrix import OUTCOMES


@pytest.fixture
def dags_folder(migrated_airflow_db: Path) -> Iterator[Path]:
    with dag_in_folder(migrated_airflow_db) as folder:
        yield folder


@pytest.fixture
def gke() -> Iterator[Any]:
    with gke_standin() as standin:
        yield standin


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not OUTCOMES:
        return
    terminalreporter.section("fault matrix (tpu_llm_pipeline_gke on the stand-ins)")
    for outcome in OUTCOMES:
        terminalreporter.write_line(outcome.row())
    leaked = sum(o.leaked for o in OUTCOMES)
    duplicated = sum(o.duplicated for o in OUTCOMES)
    recovered = sum(o.recovered for o in OUTCOMES)
    terminalreporter.write_line(
        f"fault matrix: {len(OUTCOMES)} cases, {leaked} leaked, {duplicated} duplicated, {recovered} recovered"
    )
