"""Helpers for the real-Airflow tests (tests/airflow_services): its REST API, runs and artifacts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.processes import processes_with_env

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
PIPELINE = "tpu_llm_pipeline_local"
TERMINAL_RUN_STATES = {"success", "failed"}


@contextmanager
def running_airflow(base: Path, extra_dags: list[Path], wait_for: list[str]) -> Iterator[Any]:
    """A real local Airflow (api-server, scheduler, dag-processor, triggerer) started through the same code as
    `tpuflow airflow up`, in `base` with its own TPUFLOW_HOME (local Ray clusters, slice leases) and output root,
    the project's DAGs and `extra_dags` in its DAGs folder. Stopped by process group at the end, with the local
    clusters its runs left; the caller fails if any of its processes outlive that."""
    from tpuflow_rehearsal.airflow_services import AirflowServices

    dags = base / "dags"
    dags.mkdir()
    for dag_file in [*(REPO / "dags").glob("*.py"), *extra_dags]:
        (dags / dag_file.name).symlink_to(dag_file)
    tpuflow_home = base / "tpuflow-home"
    extra = {
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "TPUFLOW_HOME": str(tpuflow_home),
        "TPUFLOW_OUTPUT_ROOT": str(base / "outputs"),
        "TPUFLOW_PROBE_LEASES": str(base / "probe" / "leases"),
        "JAX_PLATFORMS": "cpu",
    }
    started = time.time()
    svc = AirflowServices.start(base / "airflow", use_schedule=False, extra_env=extra, timeout=300)
    try:
        svc.wait_for_dags(wait_for)
        print(f"\nreal Airflow up, DAGs parsed, in {time.time() - started:.0f}s at {svc.url}")
        yield svc
    finally:
        svc.stop()
        stop_local_clusters(tpuflow_home / "clusters")
        leftovers = processes_with_env("AIRFLOW_HOME", str(svc.home))
        assert leftovers == [], f"processes of the test Airflow outlived stop(): {leftovers}"


def stop_local_clusters(base: Path) -> None:
    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster

    for state in base.glob(f"*/{STATE_FILE}"):
        LocalRayCluster.load(state.parent).stop()


def wait_for_runs(api: Any, dag_id: str, run_ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Poll until every run is success or failed; returns {run_id: run} (with its task instances)."""
    deadline = time.time() + timeout
    runs: dict[str, dict[str, Any]] = {}
    while time.time() < deadline:
        runs = {rid: api.get(f"/dags/{dag_id}/dagRuns/{rid}").json() for rid in run_ids}
        if all(r.get("state") in TERMINAL_RUN_STATES for r in runs.values()):
            break
        time.sleep(3)
    for rid, run in runs.items():
        run["tis"] = {ti["task_id"]: ti for ti in task_instances(api, dag_id, rid)}
    return runs


def task_instances(api: Any, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    return list(api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"])


def _log_line(entry: Any) -> str:
    """A structured task-log entry as the UI shows it: the event, and an exception's type, message and place."""
    if not isinstance(entry, dict):
        return str(entry)
    text = str(entry.get("event", entry))
    for detail in entry.get("error_detail") or []:
        frames = detail.get("frames") or [{}]
        where = f"{frames[-1].get('filename')}:{frames[-1].get('lineno')}"
        text += f"\n{detail.get('exc_type')}: {detail.get('exc_value')} (at {where})"
    return text


def explain(api: Any, dag_id: str, run: dict[str, Any]) -> str:
    """What a user would look at when a run did not succeed: task states and the failed tasks' log tails."""
    lines = [f"run {run.get('dag_run_id')} is {run.get('state')}"]
    for ti in run.get("tis", {}).values():
        lines.append(f"  {ti['task_id']}: {ti['state']} (try {ti['try_number']})")
        if ti["state"] in ("failed", "up_for_retry"):
            resp = api.get(
                f"/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances/{ti['task_id']}/logs/{max(ti['try_number'], 1)}",
                headers={"Accept": "application/json"},
            )
            content = resp.json().get("content", []) if resp.ok else resp.text
            text = "\n".join(_log_line(c) for c in content)
            lines.append("    " + text[-3000:].replace("\n", "\n    "))
    return "\n".join(lines)


def backfill_create(services: Any, dag_id: str, from_date: str, to_date: str, *extra: str) -> None:
    """`airflow backfill create` as a user types it.

    SQLite (this local deployment's DB) can refuse the CLI's write transaction outright while the
    scheduler commits ("database is locked": no busy wait for a stale read snapshot); the command
    then rolls back, so running it again is what a user would do. Only that error is retried.
    """
    args = ("backfill", "create", "--dag-id", dag_id, "--from-date", from_date, "--to-date", to_date, *extra)
    for attempt in range(4):
        created = services.airflow(*args, check=False)
        if created.returncode == 0 or "database is locked" not in created.stderr or attempt == 3:
            break
        time.sleep(5)
    assert created.returncode == 0, created.stderr[-3000:]
