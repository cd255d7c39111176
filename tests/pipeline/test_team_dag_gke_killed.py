"""Issue 45's "done when": a team's own package (tests/support/team_gke_package.py, written into a temporary
folder; its prep writes gs:// with plain Ray Data and pyarrow) runs its DAG on the GKE rehearsal (the real
Kubernetes API server and KubeRay operator, `tpuflow standins up --control-plane real`); its `airflow dags test` is
killed with SIGKILL mid-training; `tpuflow reap` from a plain shell (no metadata DB) deletes its node pool and
RayClusters, books the killed run's chip time and frees its slice lease; a rerun of the date resumes from the
killed run's checkpoint with the data not doubled."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.team_gke_package import DAG_ID, write_team_project

pytestmark = pytest.mark.slow

DATE = "2026-12-05"
CONF = {
    "topology": "2x2",
    "train_steps": 20,  # killed at its first checkpoint (step 3) a few steps later: the rerun has steps left
    "checkpoint_every": 3,
    "num_train": 300,
    "num_eval": 40,
    "preflight": False,
}
BIN = Path(sys.executable).parent


def _exports(text: str) -> dict[str, str]:
    import shlex

    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            out[key] = shlex.split(value)[0] if value else ""
    return out


def _until(what: str, ok: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f}s:\n{log.read_text()[-6000:]}")
        time.sleep(2)


def _gcs(env: dict[str, str]) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": env["STORAGE_EMULATOR_HOST"]},
    )


def _objects(env: dict[str, str], uri: str) -> list[str]:
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    return [b.name for b in _gcs(env).list_blobs(bucket, prefix=prefix.rstrip("/") + "/")]


def _read(env: dict[str, str], uri: str) -> str | None:
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    blob = _gcs(env).bucket(bucket).get_blob(name)
    return None if blob is None else blob.download_as_text()


def _train_rows(env: dict[str, str], run: str) -> int:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    host = env["STORAGE_EMULATOR_HOST"].removeprefix("http://")
    fs = pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=host)
    return pq.read_table(f"{run}/data/train".removeprefix("gs://"), filesystem=fs).num_rows


def _listed(env: dict[str, str], *command: str) -> list[str]:
    proc = subprocess.run(list(command), capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if line.strip()]


# CI's one run of a pipeline end to end on the real control plane: the rerun of the killed date
@pytest.mark.timeout(2400)
def test_a_killed_team_run_on_gke_is_reaped_from_a_plain_shell_and_its_rerun_resumes(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("kubectl") is None or shutil.which("gcloud") is None:
        pytest.skip("the real control plane needs root (pod network namespaces), kubectl and gcloud")
    work, dags = tmp_path / "standins", tmp_path / "dags"
    write_team_project(dags)
    tpuflow = [sys.executable, "-m", "tpuflow.cli"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TPUFLOW", "STORAGE_EMULATOR"))}
    base["TPUFLOW_HOME"] = str(tmp_path / "home")
    up = subprocess.run(
        [*tpuflow, "standins", "up", "--workdir", str(work), "--control-plane", "real", "--operation-seconds", "1"],
        capture_output=True, text=True, env=base, timeout=600,
    )  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        exported = subprocess.run([*tpuflow, "standins", "env", "--workdir", str(work)], capture_output=True,
                                  text=True, env=base, timeout=120)  # fmt: skip
        assert exported.returncode == 0, exported.stderr
        # what a user's shell has after `source env.sh` and `eval "$(tpuflow standins env ...)"`
        shell = {**base, **_exports((work / "env.sh").read_text()), **_exports(exported.stdout)}
        airflow = {
            **shell,
            "AIRFLOW_HOME": str(tmp_path / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PATH": f"{BIN}{os.pathsep}{shell.get('PATH', '')}",
        }
        migrated = subprocess.run([str(BIN / "airflow"), "db", "migrate"], capture_output=True, text=True,
                                  env=airflow, timeout=600)  # fmt: skip
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        output_root = shell["AIRFLOW_VAR_TPUFLOW_GKE_OUTPUT_ROOT"]
        run = f"{output_root}/{DAG_ID}/{DATE}"
        test = [str(BIN / "airflow"), "dags", "test", DAG_ID, DATE, "-c", json.dumps(CONF)]

        # --- the first run, killed with SIGKILL once its first checkpoints are on GCS ------------------
        log = tmp_path / "first.log"
        with log.open("w") as out:
            first = subprocess.Popen(test, stdout=out, stderr=subprocess.STDOUT, env=airflow)
        try:
            _until("a checkpoint", lambda: any("checkpoint_" in o for o in _objects(shell, f"{run}/train")), 1200, log)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        pools = _listed(shell, "gcloud", "container", "node-pools", "list", "--format=value(name)")
        clusters = _listed(shell, "kubectl", "get", "rayclusters", "-o", "name")
        assert [p for p in pools if p != "default-pool"] and clusters, (pools, clusters)
        leases = f"{output_root}/_tpuflow/slice-leases"
        assert [o for o in _objects(shell, leases) if "slot-" in o], "the killed run holds no lease"

        # --- `tpuflow reap` from a plain shell: the stand-ins' exports, no metadata DB ------------------
        plain = {**shell, "AIRFLOW_HOME": str(tmp_path / "plain-shell")}
        reaped = subprocess.run([*tpuflow, "reap"], capture_output=True, text=True, env=plain, timeout=900)
        said = reaped.stdout + reaped.stderr
        print(said)
        assert reaped.returncode == 0, said
        assert "the process that supervised its run is gone" in said, said
        assert _listed(shell, "kubectl", "get", "rayclusters", "-o", "name") == [], said
        left = _listed(shell, "gcloud", "container", "node-pools", "list", "--format=value(name)")
        assert [p for p in left if p != "default-pool"] == [], (left, said)
        assert not [o for o in _objects(shell, leases) if "slot-" in o], said
        booked = json.loads(_read(shell, f"{run}/reaped_ledger.json") or "[]")
        (entry,) = booked
        assert entry["run_id"].startswith("manual__") and entry["chip_hours"] > 0, entry
        assert {line["chips"] for line in entry["slices"]} == {4}, entry
        assert "chip-hours until reaped" in said, said

        # --- the rerun of the date: resumes, and the data is replaced, not doubled ----------------------
        second = subprocess.run(test, capture_output=True, text=True, env=airflow, timeout=1500)
        tail = (second.stdout + second.stderr)[-6000:]
        assert second.returncode == 0, tail
        report = json.loads(_read(shell, f"{run}/report.json") or "{}")
        training = report.get("training") or {}
        assert training.get("resumed_from"), report
        assert _train_rows(shell, run) == CONF["num_train"], tail
        # ... and its teardowns leave nothing: no RayCluster, no pool but GKE's default, no lease; its ledger billed
        # the one 4-chip training slice
        assert _listed(shell, "kubectl", "get", "rayclusters", "-o", "name") == []
        left = _listed(shell, "gcloud", "container", "node-pools", "list", "--format=value(name)")
        assert [p for p in left if p != "default-pool"] == [], left
        assert not [o for o in _objects(shell, leases) if "slot-" in o], tail
        assert [s["chips"] for s in report["ledger"]["slices"]] == [4], report["ledger"]
    finally:
        down = subprocess.run([*tpuflow, "standins", "down", "--workdir", str(work)], capture_output=True, text=True,
                              env=base, timeout=300)  # fmt: skip
        assert down.returncode == 0, down.stdout + down.stderr
