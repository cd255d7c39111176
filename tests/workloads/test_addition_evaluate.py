"""The evaluate entrypoint: Ray Data batch inference over the held-out parquet set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from addition import evaluate
from addition.inference import Predictor, exact_match
from tpuflow_driver.result import parse_result


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_evaluate_matches_in_process_exact_match(
    framework: str,
    prepared: dict[str, Any],
    trained: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    output = tmp_path / "predictions.json"
    evaluate.main(["--checkpoint", trained["checkpoint"], "--framework", framework,
                   "--data", prepared["heldout_path"], "--output", str(output)])  # fmt: skip
    result = parse_result(capsys.readouterr().out)
    assert result is not None
    held = pq.read_table(prepared["heldout_path"], columns=["prompt", "answer"]).to_pydict()
    expected = exact_match(Predictor.from_checkpoint(trained["checkpoint"]), held["prompt"], held["answer"])
    assert result["n"] == 200 and result["accuracy"] == pytest.approx(expected)
    assert result["accuracy"] >= 0.9 and result["correct"] == round(result["accuracy"] * 200)
    assert (result["framework"], result["trained_with"], result["step"]) == (framework, "jax", 1500)
    assert len(result["samples"]) == 5
    assert all(set(s) == {"prompt", "completion", "expected"} for s in result["samples"])
    saved = json.loads(output.read_text())
    assert len(saved["predictions"]) == 200
    assert sum(p["correct"] for p in saved["predictions"]) == result["correct"]
    assert result["samples"] == [
        {k: p[k] for k in ("prompt", "completion", "expected")} for p in saved["predictions"][:5]
    ]


def test_evaluate_refuses_a_directory_that_is_no_checkpoint(ray_local: dict[str, Any], tmp_path: Path) -> None:
    from addition.checkpoint import CheckpointError

    with pytest.raises(CheckpointError):
        evaluate.evaluate(str(tmp_path), "jax", str(tmp_path))


def test_each_actor_holds_one_hosts_tpu_resources() -> None:
    assert evaluate.host_resources(4, "TPU-V6E") == {
        "num_cpus": 0,
        "resources": {"TPU": 4, "accelerator_type:TPU-V6E": 0.001},
    }
    assert evaluate.host_resources(8, None) == {"num_cpus": 0, "resources": {"TPU": 8}}
    assert evaluate.host_resources(0, "TPU-V6E") == {}  # a CPU-only cluster
    with pytest.raises(SystemExit):
        evaluate.parse_args(["--checkpoint", "c", "--framework", "jax", "--data", "d", "--num-hosts", "0"])


def test_the_pipelines_evaluate_step_passes_the_training_slices_hosts() -> None:
    import shlex
    from dataclasses import replace

    import jinja2
    from airflow.sdk import DAG
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.factory import training_steps
    from tpuflow.rayjob.operators import command_line
    from tpuflow.tpu import TpuSlice

    job = replace(ADDITION, evaluate_in_training=False)  # the evaluate job, as tpu_llm_pipeline_gke runs it
    with DAG("eval_args_test", schedule=None):
        _, _, step = training_steps({"dashboard_url": "http://127.0.0.1:1"}, "/runs/x", workload=job)
    checked = TpuSlice.from_spec("TPU-V6E", "4x4").to_dict()

    class TI:
        def xcom_pull(self, task_ids: str) -> dict[str, Any]:
            return {"check_params": checked, "train": {"checkpoint": "/ckpt"}}[task_ids]

    argv = [jinja2.Template(item).render(params={"framework": "jax"}, ti=TI()) for item in step.entrypoint]
    args = evaluate.parse_args(shlex.split(command_line(argv))[3:])
    assert (args.num_hosts, args.tpu_per_host, args.accelerator_type) == (4, 4, "TPU-V6E")
    assert args.checkpoint == "/ckpt" and args.data == "/runs/x/data/heldout"


def test_evaluation_splits_over_several_actors_and_reports_its_rate(
    prepared: dict[str, Any], trained: dict[str, Any]
) -> None:
    summary, predictions = evaluate.evaluate(trained["checkpoint"], "jax", prepared["heldout_path"], num_hosts=2)
    held = pq.read_table(prepared["heldout_path"], columns=["prompt", "answer"]).to_pydict()
    expected = exact_match(Predictor.from_checkpoint(trained["checkpoint"]), held["prompt"], held["answer"])
    assert summary["accuracy"] == pytest.approx(expected) and summary["num_hosts"] == 2
    assert [p["prompt"] for p in predictions] == held["prompt"]  # order kept across the split
    assert summary["examples_per_s"] > 0 and summary["eval_seconds"] > 0
    print(
        f"evaluate: {summary['n']} examples, {summary['examples_per_s']} examples/s over {summary['num_hosts']} actors"
    )


@pytest.mark.slow
@pytest.mark.long  # its own 2-host cluster and model; make test's jax demo checks eval_hosts on 4 hosts
def test_evaluation_runs_one_actor_on_every_host_of_the_slice(
    v6e_2x4: Any, trained: dict[str, Any], tmp_path: Path
) -> None:
    import shlex
    import sys
    import time

    import pyarrow as pa
    from addition import data
    from ray.job_submission import JobStatus, JobSubmissionClient

    from tpuflow import workloads_dir

    cluster, tpu = v6e_2x4
    # The prep step's held-out rows, written without a second (in-process) Ray cluster.
    rows = data.generate(trained["date"], "heldout", 200, num_heldout=200)
    heldout = tmp_path / "heldout"
    heldout.mkdir()
    table = pa.table({k: list(rows[k]) for k in ("problem_id", "prompt", "answer")})
    pq.write_table(table, heldout / "part-0.parquet")
    client = JobSubmissionClient(cluster.dashboard_url, headers=cluster.auth_headers())
    args = [
        "--checkpoint", trained["checkpoint"], "--framework", "jax", "--data", str(heldout),
        "--num-hosts", str(tpu.num_hosts), "--tpu-per-host", str(tpu.logical_devices_per_host),
        "--accelerator-type", tpu.generation.ray_accelerator_type,
    ]  # fmt: skip
    job = client.submit_job(
        entrypoint=f"{shlex.quote(sys.executable)} -m addition.evaluate {shlex.join(args)}",
        runtime_env={"working_dir": str(workloads_dir()), "env_vars": {"JAX_PLATFORMS": "cpu"}},
    )
    deadline = time.time() + 420
    while (status := client.get_job_status(job)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.time() < deadline, f"job {job} still {status}: {client.get_job_logs(job)[-3000:]}"
        time.sleep(1)
    logs = client.get_job_logs(job)
    assert status == JobStatus.SUCCEEDED, logs[-4000:]
    result = parse_result(logs)
    assert result is not None, logs[-4000:]
    # Each actor held a whole host's TPU, so the two actors ran on the slice's two hosts.
    assert (result["num_hosts"], result["hosts_used"]) == (2, 2)
    assert result["n"] == 200 and result["accuracy"] >= 0.9 and result["examples_per_s"] > 0
