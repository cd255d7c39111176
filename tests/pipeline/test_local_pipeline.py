"""The product as a user runs it: `tpuflow demo` (airflow dags test of tpu_llm_pipeline_local)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
TPUFLOW = [sys.executable, "-m", "tpuflow.cli"]
DATE = "2026-11-03"
DAG_ID = "tpu_llm_pipeline_local"
MULTI_HOST = ("--topology", "2x4", "--machine-type", "ct6e-standard-4t")  # two 4-chip hosts


def run_demo(work: Path, *args: str, timeout: float = 1500, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TPUFLOW_HOME": str(work / "home"), **env_vars}
    return subprocess.run(
        [*TPUFLOW, "demo", "--work-dir", str(work), "--date", DATE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def cluster_states(work: Path) -> list[Path]:
    return list((work / "home" / "clusters").glob("*/state.json"))


@pytest.fixture
def stop_kept_clusters(tmp_path):
    """A failing assertion must not leave the kept endpoint's cluster running on a shared machine."""
    yield
    from tpuflow.local.cluster import LocalRayCluster

    for state in cluster_states(tmp_path):
        LocalRayCluster.load(state.parent).stop()


def slice_host_placement(state_dir: Path) -> list[tuple[str, str]]:
    """(slice name, TPU worker id) of the node of each live SliceHost actor (a multi-host replica's workers)."""
    from support.ray_cluster import alive_actors

    from tpuflow.local.cluster import LocalRayCluster

    cluster = LocalRayCluster.load(state_dir)
    labels = {n["node_id"]: n.get("labels") or {} for n in cluster.nodes_summary()}
    node_labels = [labels.get(a["node_id"], {}) for a in alive_actors(cluster, "SliceHost")]
    return sorted((lab.get("ray.io/tpu-slice-name", ""), lab.get("ray.io/tpu-worker-id", "")) for lab in node_labels)


@pytest.mark.long  # ~6 min on 2 cores (CI time); make test runs the pipeline through a real Airflow (test_pipeline_runs)
@pytest.mark.timeout(1800)  # the demo's own 1500 s wait, not the suite's 900 s default
def test_jax_pipeline_end_to_end_with_kept_endpoint(tmp_path, stop_kept_clusters):
    """The kept endpoint serves one model from both hosts of the (simulated) v6e 2x4 training slice, the smallest
    multi-host shape (the demo's default 4x4 has the same code path with twice the hosts). The run holds it while it
    answers, and once a whole minute passed without a successful answer its teardowns delete it."""
    from openai import OpenAI

    env = {**os.environ, "TPUFLOW_HOME": str(tmp_path / "home")}
    args = ("--framework", "jax", *MULTI_HOST, "--serve-topology", "2x4", "--keep-endpoint", "--idle-timeout", "1")
    command = [*TPUFLOW, "demo", "--work-dir", str(tmp_path), "--date", DATE, *args]
    log = tmp_path / "demo.log"  # a file, not a pipe: the demo's log lines would fill a pipe nobody reads yet
    with log.open("w") as out, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env) as demo:
        deadline = time.time() + 1500
        while not (reports := list((tmp_path / "outputs").rglob("report.json"))):
            assert demo.poll() is None and time.time() < deadline, "the demo ended or stalled before its report"
            time.sleep(5)
        time.sleep(1)  # written whole (it is replaced atomically, but its folder listing may come first)
        report = json.loads(reports[0].read_text())
        assert report["accuracy"] >= 0.9 and report["heldout_examples"] == 200
        assert report["eval_hosts"] == 2, "the evaluation runs on every host of the 2x4 slice"
        assert report["sample_completion"].strip().startswith("42")
        run_dir = Path(report["output_dir"])
        assert run_dir.name == DATE and (run_dir / "data" / "train").is_dir()
        train_log = (run_dir / "logs" / "train-jax.log").read_text()
        assert "[train_jax] step" in train_log
        # evaluated by the training workers after the last step: no second job, no second start-up
        assert f"held-out exact match {round(report['accuracy'] * 200)}/200" in train_log
        assert not (run_dir / "eval").exists() and not (run_dir / "logs" / "evaluate-jax.log").exists()

        # While the run holds it, the kept endpoint answers the official OpenAI client from both hosts.
        client = OpenAI(base_url=report["endpoint"], api_key="unused")
        assert [m.id for m in client.models.list().data] == ["addition"]
        for prompt, answer in (("17+25=", "42"), ("58+39=", "97"), ("3+4=", "7"), ("0+0=", "0"), ("99+99=", "198")):
            completion = client.completions.create(model="addition", prompt=prompt, max_tokens=4, temperature=0)
            assert completion.choices[0].text == answer, (prompt, completion.choices[0].text)
        (state,) = cluster_states(tmp_path)
        placement = slice_host_placement(state.parent)
        assert len(placement) == 2 and len({name for name, _ in placement}) == 1, placement
        assert sorted(worker for _, worker in placement) == ["0", "1"], placement
        demo.wait(timeout=900)  # a minute without a request: the watch ends, the teardowns delete
    output = log.read_text(errors="replace")
    assert demo.returncode == 0 and "pipeline succeeded" in output, output[-5000:]
    assert cluster_states(tmp_path) == [], "the idle endpoint's cluster outlived its run"


@pytest.mark.long  # two demo runs (6 min on 2 cores); make test writes to a bucket in tests/gcs and tests/rayjob
@pytest.mark.timeout(2700)
def test_torch_pipeline_on_gs_survives_transient_faults_and_a_rerun_reuses_the_bucket(
    tmp_path, gcs_emulator, monkeypatch
):
    """TorchTrainer on a two-host slice with a gs:// output root (an emulator the demo did not start), behind a
    proxy that fails parquet and checkpoint uploads now and then (503, 429, connection reset): the clients'
    own retries carry every write, and data, checkpoints, evaluation, report and logs land in the bucket;
    nothing is left running. The same date again from a new Airflow home reuses what the bucket holds."""
    from support.fault_proxy import FaultProxy, Rule, writes_to
    from support.gcs_bucket import list_bucket

    from tpuflow.storage import read_text
    from tpuflow_rehearsal.gcs_emulator import EMULATOR_ENV

    bucket, run = "tpuflow-demo", f"run/{DAG_ID}/{DATE}"
    proxy = FaultProxy(gcs_emulator.url).start()
    proxy.add(Rule(503, writes_to(".parquet"), every=2, limit=2))
    proxy.add(Rule("reset", writes_to(".parquet"), every=3, limit=1))
    proxy.add(Rule(503, writes_to("checkpoint_"), every=3, limit=3))
    proxy.add(Rule(429, writes_to("checkpoint_"), every=5, limit=1))
    proxy.add(Rule("reset", writes_to("checkpoint_"), every=7, limit=1))
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)  # this process lists the bucket too, past the proxy
    args = ("--framework", "torch", *MULTI_HOST, "--output-root", f"gs://{bucket}/run")
    try:
        out = run_demo(
            tmp_path, *args, "--train-steps", "1200", "--accuracy-threshold", "0.5", **{EMULATOR_ENV: proxy.url}
        )
    finally:
        proxy.stop()
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-5000:]
    assert "pipeline succeeded" in out.stdout and f"gs://{bucket}/{run}" in out.stdout
    injected = [target for _, target, _ in proxy.injected]
    assert sum(".parquet" in t for t in injected) >= 2 and sum("checkpoint_" in t for t in injected) >= 3, injected

    relative = [n[len(run) + 1 :] for n in list_bucket(bucket, run + "/")]
    assert "data/_SUCCESS" in relative
    assert any(n.startswith("data/train/") and n.endswith(".parquet") for n in relative)
    assert any(n.startswith("data/heldout/") and n.endswith(".parquet") for n in relative)
    checkpoints = {n.rsplit("/", 1)[0] for n in relative if n.startswith("train/") and n.endswith("/meta.json")}
    assert len(checkpoints) >= 1 and all("/checkpoint_" in c for c in checkpoints)
    # no checkpoint lost to a failed upload: each one is whole (its weights next to its meta.json)
    assert all(any(n.startswith(c + "/") and not n.endswith("meta.json") for n in relative) for c in checkpoints)
    assert "report.json" in relative and not any(n.startswith("eval/") for n in relative)  # evaluated in training
    assert {"logs/prep.log", "logs/train-torch.log"} <= set(relative)

    report = json.loads(read_text(f"gs://{bucket}/{run}/report.json"))
    assert report["output_dir"] == f"gs://{bucket}/{run}" and report["heldout_examples"] == 200
    assert report["accuracy"] >= 0.5
    # the ledger: the cluster's whole span, closed when it stopped, of which training was a part
    (held,) = report["ledger"]["slices"]
    assert not held["open"] and held["deleted_at"] > held["created_at"]
    assert held["chip_hours"] == pytest.approx(held["chips"] * held["seconds"] / 3600, abs=1e-5)
    assert 0 < report["ledger"]["training_chip_hours"] < report["ledger"]["chip_hours"] == held["chip_hours"]
    assert json.loads(read_text(f"gs://{bucket}/{run}/ledger.json")) == report["ledger"]
    assert "held-out exact match" in read_text(f"gs://{bucket}/{run}/logs/train-torch.log")
    # the Serve replica loaded the checkpoint from the bucket; the training workers evaluated it
    assert report["training"]["checkpoint"].startswith(f"gs://{bucket}/{run}/train/")
    assert cluster_states(tmp_path) == [], "the teardown task must stop the cluster"

    # a rerun of the date (a redeployed scheduler, a cleared run): prep is skipped, training stops at the
    # bucket's last checkpoint, the evaluation scores the same one
    again = run_demo(
        tmp_path / "rerun", *args, "--train-steps", "1200", "--accuracy-threshold", "0.5",
        **{EMULATOR_ENV: gcs_emulator.url},
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-5000:] + again.stderr[-5000:]
    assert "exists with the same parameters; skipping" in read_text(f"gs://{bucket}/{run}/logs/prep.log")
    assert "nothing to train" in read_text(f"gs://{bucket}/{run}/logs/train-torch.log")
    after = [n[len(run) + 1 :] for n in list_bucket(bucket, run + "/")]
    assert {n for n in after if n.startswith("data/")} == {n for n in relative if n.startswith("data/")}
    assert {n.rsplit("/", 1)[0] for n in after if n.startswith("train/") and n.endswith("/meta.json")} == checkpoints
    # the finished checkpoint's evaluation, as its report recorded it: the same checkpoint, the same accuracy
    rerun = json.loads(read_text(f"gs://{bucket}/{run}/report.json"))
    assert rerun["training"]["checkpoint"] == report["training"]["checkpoint"]
    assert (rerun["accuracy"], rerun["heldout_examples"]) == (report["accuracy"], 200)
    assert cluster_states(tmp_path / "rerun") == []


def test_bad_params_fail_before_any_cluster_starts(tmp_path):
    out = run_demo(tmp_path, "--accelerator", "TPU-V5P", "--topology", "4x4", timeout=600)
    assert out.returncode != 0
    # The demo checks its flags with the Params' own checks before Airflow starts: the flag, one line.
    assert "--topology='4x4' is invalid" in out.stdout + out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "airflow").exists()
    assert not (tmp_path / "home" / "clusters").exists() or cluster_states(tmp_path) == []
