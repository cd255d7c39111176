"""Reruns replace, never add (issue 45): a prep job's files land under new names on every run, so the pipeline's
prep (``replace_output_dir``) empties its folder before each new job; a retry that re-attaches to its job, and a
prep without the flag (a user's own folder), leave what is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuflow.rayjob.workload_operators import RayDataPrepOperator

JOBS = Path(__file__).parent / "jobs"

pytestmark = pytest.mark.slow


def prep(cluster, output: Path, replace: bool) -> RayDataPrepOperator:
    return RayDataPrepOperator(
        task_id="prep",
        module="write_part",
        arguments={"output_dir": str(output)},
        cluster=cluster.connection_info(),
        working_dir=str(JOBS),
        replace_output_dir=replace,
        deferrable=False,
        poll_interval=0.5,
    )


def parts(output: Path) -> list[Path]:
    return sorted((output / "train").glob("part-*"))


def test_a_rerun_of_the_date_replaces_the_earlier_data(slice_cluster, fresh_context, tmp_path: Path) -> None:
    output = tmp_path / "data"
    first = fresh_context(task_id="prep")
    prep(slice_cluster, output, True).execute(first)
    (written,) = parts(output)
    # a retry of the same task re-attaches to its finished job: nothing removed, nothing written
    first["ti"].try_number = 2
    prep(slice_cluster, output, True).execute(first)
    assert parts(output) == [written]
    # a new run of the same date (another run id: a new job) replaces the earlier attempt's files
    prep(slice_cluster, output, True).execute(fresh_context(task_id="prep"))
    (replaced,) = parts(output)
    assert replaced != written
    # without the flag the folder is not the operator's to empty: the files add up
    prep(slice_cluster, output, False).execute(fresh_context(task_id="prep"))
    assert len(parts(output)) == 2
