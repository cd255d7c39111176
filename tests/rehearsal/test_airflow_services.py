"""`tpuflow airflow down` / restart / the alive checks signal only this deployment's processes, without Airflow.

services.json records each service's process group; after a reboot or a pid wrap such a pid is someone else's.
Only a process started with this deployment's AIRFLOW_HOME counts as one of its services."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest
from support.processes import sleeper, survives

from tpuflow import liveness
from tpuflow_rehearsal import airflow_services as services_mod
from tpuflow_rehearsal.airflow_services import AirflowServices


def _service(procs: list[subprocess.Popen], home: Path | None) -> subprocess.Popen:
    """A `sleep` in its own session, as a service runs; started with AIRFLOW_HOME=`home` (None: without one)."""
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_HOME"}
    if home is not None:
        env["AIRFLOW_HOME"] = str(home)
    return sleeper(procs, env=env)


def _deployment(work: Path, pids: dict[str, int]) -> AirflowServices:
    """A deployment loaded back from the services.json its start would have written."""
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    AirflowServices(work_dir=str(work), port=1, password="x", env={"AIRFLOW_HOME": str(home)}, pids=pids).save()
    return AirflowServices.load(work)


def test_down_stops_its_services_and_leaves_processes_that_took_over_recorded_pids(
    tmp_path: Path, procs: list[subprocess.Popen], caplog: pytest.LogCaptureFixture
) -> None:
    work = tmp_path / "airflow"
    ours = _service(procs, work / "home")
    unrelated = _service(procs, None)
    other_home = _service(procs, tmp_path / "other" / "home")  # another deployment's scheduler
    services = _deployment(work, {"scheduler": unrelated.pid, "triggerer": ours.pid, "dag-processor": other_home.pid})

    assert services.alive_services() == ["triggerer"]
    with caplog.at_level(logging.INFO, logger=services_mod.__name__):
        stopped = services.stop(timeout=5)

    assert stopped == ["triggerer"]
    assert ours.wait(timeout=10) is not None
    assert survives(unrelated) and survives(other_home), "a process that is not this deployment's was signalled"
    assert AirflowServices.load(work).pids == {}
    assert f"pid {unrelated.pid} of services.json is no longer this Airflow's" in caplog.text


def test_restart_does_not_signal_a_process_that_took_over_the_services_pid(
    tmp_path: Path, procs: list[subprocess.Popen], monkeypatch: pytest.MonkeyPatch
) -> None:
    unrelated = _service(procs, None)
    services = _deployment(tmp_path / "airflow", {"scheduler": unrelated.pid})
    spawned: list[str] = []
    monkeypatch.setattr(AirflowServices, "_spawn", lambda self, name: spawned.append(name) or 0)
    monkeypatch.setattr(AirflowServices, "wait_healthy", lambda self, timeout: {})

    services.restart("scheduler")

    assert spawned == ["scheduler"]
    assert survives(unrelated)


def test_a_service_is_known_by_its_recorded_start_not_its_environment(
    tmp_path: Path, procs: list[subprocess.Popen]
) -> None:
    """Airflow's setproctitle overwrites /proc/<pid>/environ: a leader recorded at spawn is proved by its pid
    and start time; a process at a recorded pid with another start time is not the service, whatever its env."""
    work = tmp_path / "airflow"
    retitled = _service(procs, None)  # the api-server after setproctitle: no readable AIRFLOW_HOME
    reused = _service(procs, work / "home")  # this home's variable, but not the process recorded at spawn
    services = _deployment(work, {"api-server": retitled.pid, "scheduler": reused.pid})
    services.started = {
        "api-server": liveness.process_record(retitled.pid),
        "scheduler": {**liveness.process_record(reused.pid), "start": 1},
    }
    services.save()
    services = AirflowServices.load(work)

    assert services.alive_services() == ["api-server"]
    assert services.stop(timeout=5) == ["api-server"]
    assert retitled.wait(timeout=10) is not None
    assert survives(reused)
