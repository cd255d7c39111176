"""The fault matrix's real-Airflow rows: `tpu_llm_pipeline_local` triggered through the REST API of a running
Airflow (api-server, scheduler, dag-processor, triggerer, LocalExecutor; support.real_airflow.running_airflow),
with a fault at one task while it runs or is deferred: the task marked failed, marked success or cleared
through the REST API, the triggerer or the scheduler restarted, the task's process killed with SIGKILL, the
run deleted from the metadata DB, the Ray dashboard frozen for 30 s.

Counted once the run ended (a deleted run: once `tpuflow reap` ran, since nothing of the run is left to
tear down): local Ray clusters still recorded, Ray processes of the Airflow's TPUFLOW_HOME still alive,
slice leases still held; and Ray jobs submitted twice for one task while the first was neither stopped nor
ended (duplicated), from the "Submitting Ray job" / "resubmitting" lines of every try's log.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.processes import cmdline
from support.real_airflow import PIPELINE, TERMINAL_RUN_STATES, explain, task_instances

from faults.local_matrix import CONF  # a one-host slice, a short training, no accuracy gate
from faults.matrix import Outcome, settled

RUN_TIMEOUT = 900.0
KEPT_IDLE = {"keep_endpoint": True, "idle_timeout": 1}  # kept until no request for a minute
FROZEN_S = 30.0  # how long the dashboard stays unreachable


@dataclass
class Drill:
    """What an injection acts on: the running Airflow, its REST API and the run."""

    services: Any
    api: Any
    run_id: str
    stage: str

    @property
    def home(self) -> Path:
        return Path(self.services.env["TPUFLOW_HOME"])

    def ti(self) -> dict[str, Any]:
        return dict(self.api.get(f"/dags/{PIPELINE}/dagRuns/{self.run_id}/taskInstances/{self.stage}").json())

    def cluster(self) -> Any:
        from tpuflow.local.cluster import STATE_FILE, LocalRayCluster

        states = sorted((self.home / "clusters").glob(f"*/{STATE_FILE}"))
        assert states, "no local cluster is recorded"
        return LocalRayCluster.load(states[0].parent)


@dataclass(frozen=True)
class AirflowFaultCase:
    stage: str
    fault: str
    when: str  # the stage's state the fault waits for: running | deferred
    inject: Callable[[Drill], None]
    recovers: bool  # whether the run still succeeds
    reaped: bool = False  # nothing of the run can tear down: `tpuflow reap` cleans up after it
    ci: bool = False
    conf: Mapping[str, Any] | None = None  # the run's conf beyond the matrix's CONF

    pipeline = "airflow"

    @property
    def id(self) -> str:
        return f"airflow-{self.stage}-{self.fault}"


def _set_state(state: str) -> Callable[[Drill], None]:
    def inject(d: Drill) -> None:
        resp = d.api.patch(f"/dags/{PIPELINE}/dagRuns/{d.run_id}/taskInstances/{d.stage}", json={"new_state": state})
        assert resp.status_code == 200, resp.text

    return inject


def _clear(d: Drill) -> None:
    resp = d.api.post(
        f"/dags/{PIPELINE}/clearTaskInstances",
        json={"dry_run": False, "dag_run_id": d.run_id, "task_ids": [d.stage], "only_failed": False},
    )
    assert resp.status_code == 200, resp.text


def _restart(service: str) -> Callable[[Drill], None]:
    def inject(d: Drill) -> None:
        d.services.restart(service)

    return inject


def _restart_scheduler_and_triggerer(d: Drill) -> None:
    d.services.restart("scheduler")
    d.services.restart("triggerer")


def _sigkill_task(d: Drill) -> None:
    pid = d.ti().get("pid")
    assert pid, f"the running task reports no pid: {d.ti()}"
    os.kill(int(pid), signal.SIGKILL)


def _delete_run(d: Drill) -> None:
    """Delete the running run's rows from the metadata DB (the REST API refuses to delete a running run; an
    operator cleaning the DB by hand does not ask): its task instances go with it (ON DELETE CASCADE)."""
    import sqlite3

    url = d.services.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert url.startswith("sqlite:///"), url
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)) as db, db:
        db.execute("PRAGMA foreign_keys=ON")
        deleted = db.execute("DELETE FROM dag_run WHERE dag_id = ? AND run_id = ?", (PIPELINE, d.run_id)).rowcount
    assert deleted == 1, f"run {d.run_id} not found in the metadata DB"
    assert d.api.get(f"/dags/{PIPELINE}/dagRuns/{d.run_id}/taskInstances/{d.stage}").status_code == 404


def _freeze_dashboard(d: Drill) -> None:
    """SIGSTOP the head's dashboard process (the Jobs API, the log tail) for FROZEN_S, then SIGCONT."""
    from tpuflow.local.cluster import _pids_referencing

    cluster = d.cluster()
    pids = [p for p in _pids_referencing(cluster.temp_dir) if "dashboard/dashboard.py" in cmdline(p)]
    assert pids, "no dashboard process found for the run's cluster"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(FROZEN_S)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


AIRFLOW_CASES: list[AirflowFaultCase] = [
    AirflowFaultCase("train", "marked-failed-deferred", "deferred", _set_state("failed"), False, ci=True),
    AirflowFaultCase("train", "marked-success-deferred", "deferred", _set_state("success"), False),
    AirflowFaultCase("train", "cleared-deferred", "deferred", _clear, True),
    AirflowFaultCase("train", "triggerer-restart-deferred", "deferred", _restart("triggerer"), True),
    AirflowFaultCase("train", "scheduler-restart-deferred", "deferred", _restart("scheduler"), True),
    AirflowFaultCase("start_cluster", "sigkill-running", "running", _sigkill_task, False),
    AirflowFaultCase("prep", "dashboard-frozen-30s", "deferred", _freeze_dashboard, True),
    AirflowFaultCase("train", "run-deleted-deferred", "deferred", _delete_run, False, reaped=True),
    # a kept endpoint waiting to be idle (serve_until_idle, deferred): the wait is rebuilt after both restarts and
    # the teardowns delete the endpoint once it is idle; marked failed, the teardowns delete it at once
    AirflowFaultCase("serve_until_idle", "scheduler-and-triggerer-restart-deferred", "deferred",
                     _restart_scheduler_and_triggerer, True, conf=KEPT_IDLE),
    AirflowFaultCase("serve_until_idle", "marked-failed-deferred", "deferred", _set_state("failed"), False,
                     conf=KEPT_IDLE),
]  # fmt: skip


def airflow_case_params() -> list[Any]:
    return [pytest.param(case, id=case.id, marks=() if case.ci else pytest.mark.long) for case in AIRFLOW_CASES]


def _wait_for_stage(d: Drill, when: str, timeout: float = 600) -> None:
    """Until the stage is `when`; a deferred stage also has its Ray job running (its trigger is waiting on it),
    a running start_cluster has its head up (the fault then hits a half-started cluster)."""
    deadline = time.time() + timeout
    state = None
    while time.time() < deadline:
        state = d.ti().get("state")
        if state == when and (when != "running" or _head_up(d)):
            if when == "deferred":
                time.sleep(3)  # the trigger picked it up and streams its log
            return
        run_state = d.api.get(f"/dags/{PIPELINE}/dagRuns/{d.run_id}").json().get("state")
        assert run_state not in TERMINAL_RUN_STATES, f"the run ended {run_state} before {d.stage} was {when}"
        time.sleep(0.5)
    raise AssertionError(f"{d.stage} never {when} (last state {state})")


def _head_up(d: Drill) -> bool:
    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster

    for state in (d.home / "clusters").glob(f"*/{STATE_FILE}"):
        try:
            cluster = LocalRayCluster.load(state.parent)
        except (OSError, ValueError):
            continue
        if cluster.is_alive():
            return True
    return False


def _wait_run(d: Drill) -> dict[str, Any]:
    deadline = time.time() + RUN_TIMEOUT
    run: dict[str, Any] = {}
    while time.time() < deadline:
        run = d.api.get(f"/dags/{PIPELINE}/dagRuns/{d.run_id}").json()
        if run.get("state") in TERMINAL_RUN_STATES:
            break
        time.sleep(3)
    run["tis"] = {ti["task_id"]: ti for ti in task_instances(d.api, PIPELINE, d.run_id)}
    return run


def _reap(d: Drill) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "tpuflow.cli", "reap", "--older-than", "0s"],
        env=d.services.process_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def _task_log(d: Drill, task_id: str, try_number: int) -> str:
    resp = d.api.get(
        f"/dags/{PIPELINE}/dagRuns/{d.run_id}/taskInstances/{task_id}/logs/{try_number}",
        headers={"Accept": "application/json"},
    )
    if not resp.ok:
        return ""
    return "\n".join(str(c.get("event", "")) if isinstance(c, dict) else str(c) for c in resp.json()["content"])


def _duplicated_jobs(d: Drill, run: dict[str, Any]) -> int:
    """Ray jobs a task submitted beyond its first that did not follow an ended (stopped, failed) one."""
    extra = 0
    for task_id, ti in run["tis"].items():
        logs = "\n".join(_task_log(d, task_id, n) for n in range(1, max(int(ti["try_number"]), 1) + 1))
        submitted = set(re.findall(r"Submitting Ray job (\S+):", logs))
        after_end = set(re.findall(r"Earlier job \S+ ended \S+; resubmitting as (\S+)", logs))
        extra += max(0, len(submitted) - 1 - len(after_end))
    return extra


def _leftovers(home: Path) -> dict[str, int]:
    from support.processes import processes_with_env

    def count() -> dict[str, int]:
        ray = [p for p in processes_with_env("TPUFLOW_HOME", str(home)) if re.search(r"ray|gcs_server|raylet", p)]
        return {
            "local_clusters": len(list((home / "clusters").glob("*/state.json"))),
            "ray_processes": len(ray),
            "slice_leases": len(list((home / "slice-leases").rglob("slot-*.json"))),
        }

    return settled(count)


def run_airflow_case(case: AirflowFaultCase, services: Any, api: Any) -> Outcome:
    resp = api.post(f"/dags/{PIPELINE}/dagRuns", json={"logical_date": None, "conf": {**CONF, **(case.conf or {})}})
    assert resp.status_code == 200, resp.text
    d = Drill(services, api, str(resp.json()["dag_run_id"]), case.stage)
    _wait_for_stage(d, case.when)
    case.inject(d)
    if case.reaped:
        time.sleep(10)  # the triggerer and scheduler notice the run is gone
        reaped = _reap(d)
        made = {kind: len(re.findall(rf"^deleted {kind} ", reaped, re.M)) for kind in ("local_cluster", "lease")}
        outcome = Outcome(case, "deleted", _leftovers(d.home), {}, made, run_state="reaped")
        outcome.explanation = f"tpuflow reap said:\n{reaped}"
        return outcome
    run = _wait_run(d)
    stage_state = str(run["tis"].get(case.stage, {}).get("state"))
    outcome = Outcome(
        case,
        stage_state,
        _leftovers(d.home),
        {"ray_jobs": _duplicated_jobs(d, run)},
        run_state=str(run.get("state")),
    )
    outcome.explanation = explain(api, PIPELINE, run)
    return outcome
