"""An argument list reaches a real Ray job exactly: Ray's job manager runs the entrypoint with a shell, and a
path holding a space, a quote, `;`, backticks and `$(...)` must arrive as one argument with nothing run.
(The command lines every tpuflow job builds are checked without Ray in tests/security.)"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tpuflow.rayjob.operators import RaySubmitJobOperator

JOBS = Path(__file__).parent / "jobs"

pytestmark = pytest.mark.slow


def test_a_hostile_path_reaches_the_job_as_one_argument_and_runs_nothing(slice_cluster, fresh_context, tmp_path):
    marker = tmp_path / f"pwned-{secrets.token_hex(4)}"
    path = f'{tmp_path}/out root/it\'s $(touch {marker}); touch {marker} `touch {marker}` "q"'
    op = RaySubmitJobOperator(
        task_id="job",
        entrypoint=["python", "argv.py", "--out", path, "--n", 3],
        cluster=slice_cluster.connection_info(),
        working_dir=str(JOBS),
        deferrable=False,
        poll_interval=0.5,
    )
    assert op.execute(fresh_context()) == {"argv": ["--out", path, "--n", "3"]}
    assert not marker.exists()
