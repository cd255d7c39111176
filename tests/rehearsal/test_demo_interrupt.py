"""A killed run never blocks the next (issue 26's end-to-end check): `tpuflow demo` killed with SIGKILL
mid-training, then `tpuflow reap` from a plain shell (no Airflow metadata DB), then a second `tpuflow demo`:
the second run succeeds without any manual lease command, and nothing of the first is left (no Ray process,
no lease, no state folder)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.processes import processes_with_env

pytestmark = pytest.mark.long
TPUFLOW = [sys.executable, "-m", "tpuflow.cli"]
DAG_ID = "tpu_llm_pipeline_local"
SMALL = ("--framework", "jax", "--train-steps", "1000", "--topology", "2x4", "--machine-type", "ct6e-standard-4t")


def _until(what: str, ok: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f}s:\n{log.read_text()[-5000:]}")
        time.sleep(1)


def _demo(work: Path, date: str) -> list[str]:
    return [*TPUFLOW, "demo", "--work-dir", str(work), "--date", date, *SMALL]


@pytest.mark.timeout(2400)
def test_a_sigkilled_demo_is_reaped_from_a_plain_shell_and_the_next_demo_succeeds(tmp_path: Path) -> None:
    from tpuflow.local.cluster import LocalRayCluster

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TPUFLOW_SLICE_LEASES"))}
    env["TPUFLOW_HOME"] = str(home)
    first_work, log = tmp_path / "first", tmp_path / "first.log"
    run_dir = first_work / "outputs" / DAG_ID / "2026-11-01"

    def training() -> bool:  # the followed driver log in the demo's output, or Ray Train's first checkpoint
        return "[train_jax] step" in log.read_text() or any((run_dir / "train").rglob("checkpoint_*"))

    first: subprocess.Popen[bytes] | None = None
    try:
        with log.open("w") as out:
            first = subprocess.Popen(_demo(first_work, "2026-11-01"), stdout=out, stderr=subprocess.STDOUT, env=env)
        _until("training", training, 900, log)
        states = list((home / "clusters").glob("*/state.json"))
        temp_dirs = [LocalRayCluster.load(s.parent).temp_dir for s in states]
        assert temp_dirs, "no local cluster while training"
        first.send_signal(signal.SIGKILL)
        first.wait()
        # its `airflow dags test` dies with it (PR_SET_PDEATHSIG)
        airflow_home = str(first_work / "airflow")

        def dags_test_left() -> list[str]:
            return [p for p in processes_with_env("AIRFLOW_HOME", airflow_home) if "dags test" in p]

        _until("the airflow dags test of the killed demo ending", lambda: not dags_test_left(), 30, log)
        left = sorted(p.name for p in (home / "clusters").iterdir()) + sorted(
            p.name for p in (home / "slice-leases").glob("slot-*.json")
        )
        print("left by the killed demo:", left, [processes_with_env("TPUFLOW_LOCAL_CLUSTER", t) for t in temp_dirs])

        plain = {**env, "AIRFLOW_HOME": str(tmp_path / "plain-shell-airflow")}  # no metadata DB there
        reaped = subprocess.run([*TPUFLOW, "reap"], env=plain, capture_output=True, text=True, timeout=300)
        assert reaped.returncode == 0, reaped.stdout + reaped.stderr
        assert not [p for t in temp_dirs for p in processes_with_env("TPUFLOW_LOCAL_CLUSTER", t)], reaped.stdout
        assert not list((home / "clusters").iterdir()), reaped.stdout  # no state folder
        assert not list((home / "slice-leases").glob("slot-*.json")), reaped.stdout  # no lease

        second = subprocess.run(
            _demo(tmp_path / "second", "2026-11-02"), capture_output=True, text=True, timeout=1500, env=env
        )
        assert second.returncode == 0 and "pipeline succeeded" in second.stdout, (
            second.stdout[-5000:] + second.stderr[-5000:]
        )
        assert "waiting for slice lease" not in second.stderr
    finally:
        if first is not None and first.poll() is None:
            first.kill()
            first.wait()
        for state in (home / "clusters").glob("*/state.json"):
            LocalRayCluster.load(state.parent).stop()
