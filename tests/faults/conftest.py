"""The fault matrix's fixtures and its report: the table of every case run and the final line."""

from __future__ import annotations

from typing import Any

from faults.matrix import OUTCOMES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not OUTCOMES:
        return
    terminalreporter.section("fault matrix (tpu_llm_pipeline_gke on the stand-ins, tpu_llm_pipeline_local)")
    for outcome in OUTCOMES:
        terminalreporter.write_line(outcome.row())
    leaked = sum(o.leaked for o in OUTCOMES)
    duplicated = sum(o.duplicated for o in OUTCOMES)
    recovered = sum(o.recovered for o in OUTCOMES)
    terminalreporter.write_line(
        f"fault matrix: {len(OUTCOMES)} cases, {leaked} leaked, {duplicated} duplicated, {recovered} recovered"
    )
