"""The local pipeline with a gs:// output root (`tpuflow demo --output-root gs://...`, a v6e 2x2
slice) against an emulator the demo did not start: a rerun of the same date from a fresh Airflow home
reuses what the bucket holds: prep is skipped, training resumes from (and stops at) the last checkpoint.
(One run writing every output to the bucket is tests/pipeline/test_local_pipeline.py's torch run.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.gcs_bucket import list_bucket

from tpuflow.storage import read_text
from tpuflow_rehearsal.gcs_emulator import EMULATOR_ENV

TPUFLOW = [sys.executable, "-m", "tpuflow.cli"]
DAG_ID, DATE = "tpu_llm_pipeline_local", "2026-11-04"


def _demo(work_dir: Path, env: dict[str, str], output_root: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *TPUFLOW,
            "demo",
            "--work-dir",
            str(work_dir),
            "--date",
            DATE,
            "--output-root",
            output_root,
            "--topology",
            "2x2",
            "--train-steps",
            "300",
            "--num-train",
            "3000",
            "--accuracy-threshold",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )


@pytest.mark.slow
@pytest.mark.long  # two pipeline runs: make test-long
@pytest.mark.timeout(2400)
def test_a_rerun_of_the_same_date_reuses_the_buckets_outputs(tmp_path: Path, gcs_emulator) -> None:
    """The same date twice, the second time from a new Airflow home (a redeployed scheduler, a cleared
    run): prep is skipped, training stops at the last checkpoint, the evaluation scores the same one."""
    bucket, prefix = "tpuflow-rerun", "run"
    env = {**os.environ, "TPUFLOW_HOME": str(tmp_path / "home"), EMULATOR_ENV: gcs_emulator.url}
    first = _demo(tmp_path, env, f"gs://{bucket}/{prefix}")
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-5000:]
    run = f"{prefix}/{DAG_ID}/{DATE}"
    relative = [n[len(run) + 1 :] for n in list_bucket(bucket, run + "/")]
    checkpoints = {n.rsplit("/", 1)[0] for n in relative if n.startswith("train/") and n.endswith("/meta.json")}
    evaluation = json.loads(read_text(f"gs://{bucket}/{run}/eval/jax.json"))

    again = _demo(tmp_path / "rerun", env, f"gs://{bucket}/{prefix}")
    assert again.returncode == 0, again.stdout[-5000:] + again.stderr[-5000:]
    assert "exists with the same parameters; skipping" in read_text(f"gs://{bucket}/{run}/logs/prep.log")
    train_log = read_text(f"gs://{bucket}/{run}/logs/train-jax.log")
    assert "already has checkpoints" in train_log and "nothing to train" in train_log, train_log[-3000:]
    after = [n[len(run) + 1 :] for n in list_bucket(bucket, run + "/")]
    assert {n for n in after if n.startswith("data/")} == {n for n in relative if n.startswith("data/")}
    assert {n.rsplit("/", 1)[0] for n in after if n.startswith("train/") and n.endswith("/meta.json")} == checkpoints
    rerun = json.loads(read_text(f"gs://{bucket}/{run}/eval/jax.json"))
    assert rerun["checkpoint"] == evaluation["checkpoint"] and rerun["accuracy"] == evaluation["accuracy"]


def test_demo_starts_and_stops_an_emulator_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuflow_rehearsal.gcs_emulator import emulator_for

    monkeypatch.delenv(EMULATOR_ENV)
    with emulator_for(["demo-bucket"]) as url:
        assert url.startswith("http://127.0.0.1:"), url  # a server of its own, on loopback
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": url})
        assert [b.name for b in client.list_buckets()] == ["demo-bucket"]
        port = url.rsplit(":", 1)[1]
        started = [p for p in Path("/proc").iterdir() if p.name.isdigit() and f"-port {port} " in _cmdline(p)]
        assert started, "the emulator process runs while the demo does"
    assert all(f"-port {port} " not in _cmdline(p) for p in started), "stopped when the demo ends"


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
