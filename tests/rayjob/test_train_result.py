"""A team's own Ray Train script, submitted as a plain Ray job that prints no TPUFLOW_RESULT line: with
train_run_path, its latest checkpoint and the metrics reported with it reach XCom from Ray Train's own record
of the run (Result.from_path), under whatever the job's own result line says.

One real job on the session's cluster (tests/conftest.py, shared with the other Ray-facing tests) trains a
tiny DataParallelTrainer that reports twice, each time with a checkpoint; the other tests read the run
folder it wrote, locally and copied to the GCS emulator, through the operator's end of a job
(execute_complete with the event a succeeded job's wait produces)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from support.airflow_context import new_run_id, task_context

from tpuflow.rayjob.failures import UserInputFailure
from tpuflow.rayjob.operators import QualityGateError, RaySubmitJobOperator
from tpuflow.rayjob.train_result import read_train_result
from tpuflow.rayjob.waits import _ended

pytestmark = pytest.mark.slow

# The team's script: its own trainer and RunConfig, two reports with a checkpoint each, no result line.
TRAIN_SCRIPT = """\
import os
import sys
import tempfile

import ray.train
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer


def loop(config):
    for step in (1, 2):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "weights.txt"), "w") as f:
                f.write(str(step))
            ray.train.report({"step": step, "accuracy": 0.25 * step}, checkpoint=Checkpoint.from_directory(folder))


storage_path, name = sys.argv[1], sys.argv[2]
trainer = DataParallelTrainer(
    loop, scaling_config=ScalingConfig(num_workers=1), run_config=RunConfig(storage_path=storage_path, name=name)
)
trainer.fit()
print("training done", flush=True)
"""


def _operator(cluster: dict[str, Any], code: Path, run_path: str, **kwargs: Any) -> RaySubmitJobOperator:
    return RaySubmitJobOperator(
        task_id="team_train",
        entrypoint=["python", "team_train.py", str(Path(run_path).parent), Path(run_path).name],
        cluster=cluster,
        working_dir=str(code),
        # Ray Train's controller polls workers every 2 s by default; each report then blocks that long.
        env_vars={"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"},
        deferrable=False,
        poll_interval=0.5,
        train_run_path=run_path,
        **kwargs,
    )


@pytest.fixture(scope="module")
def trained(slice_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The operator's result for the team's script, run as a real Ray job, and the run folder it wrote."""
    code = tmp_path_factory.mktemp("team_code")
    (code / "team_train.py").write_text(TRAIN_SCRIPT)
    run_path = str(tmp_path_factory.mktemp("runs") / "addition")
    op = _operator(slice_cluster.connection_info(), code, run_path)
    context = task_context(dag_id="rayjob_tests", run_id=new_run_id(), task_id="team_train")
    return {"result": op.execute(context), "run_path": run_path, "code": code}


def _complete(op: RaySubmitJobOperator, result: dict[str, Any]) -> Any:
    """The operator's end of a job that succeeded with ``result`` (its TPUFLOW_RESULT line; {}: none)."""
    context = task_context(dag_id="rayjob_tests", run_id=new_run_id(), task_id=op.task_id)
    event = _ended("team-train-1", "SUCCEEDED", "done", "training done\n", False, result)
    return op.execute_complete(context, dict(event))


def _unit_operator(run_path: str, **kwargs: Any) -> RaySubmitJobOperator:
    return RaySubmitJobOperator(
        task_id="team_train", entrypoint="python team_train.py", cluster={"dashboard_url": "http://ray.test:8265"},
        train_run_path=run_path, **kwargs,
    )  # fmt: skip


@pytest.mark.long  # a real Ray Train job on the session cluster (~40 s for the module)
def test_job_without_result_line_returns_the_latest_checkpoint_and_its_metrics(trained):
    result, run_path = trained["result"], trained["run_path"]
    assert set(result) == {"checkpoint", "metrics", "train_run_path"}
    assert result["train_run_path"] == run_path
    assert result["metrics"] == {"step": 2, "accuracy": 0.5}
    checkpoint = Path(result["checkpoint"])
    assert checkpoint.parent == Path(run_path) and checkpoint.name.startswith("checkpoint_")
    assert (checkpoint / "weights.txt").read_text() == "2", "the latest of the run's two checkpoints"


@pytest.mark.long  # a real Ray Train job on the session cluster (~40 s for the module)
def test_read_train_result_on_a_real_runs_snapshot(trained):
    assert read_train_result(trained["run_path"]) == trained["result"]
    assert read_train_result(trained["run_path"] + "/") == {
        **trained["result"],
        "train_run_path": trained["run_path"] + "/",
    }


@pytest.mark.long  # a real Ray Train job on the session cluster (~40 s for the module)
def test_the_jobs_own_result_line_wins_per_key(trained):
    line = {"checkpoint": "gs://team/exported/model", "accuracy": 0.9}
    result = _complete(_unit_operator(trained["run_path"]), line)
    assert result == {**line, "metrics": {"step": 2, "accuracy": 0.5}, "train_run_path": trained["run_path"]}


@pytest.mark.long  # a real Ray Train job on the session cluster (~40 s for the module)
def test_the_gate_reads_the_runs_metrics_when_the_top_level_has_no_such_key(trained):
    assert _complete(_unit_operator(trained["run_path"], min_result={"accuracy": 0.5}), {})["metrics"]["step"] == 2
    with pytest.raises(QualityGateError, match=r"accuracy=0.5 is below the required 0.6"):
        _complete(_unit_operator(trained["run_path"], min_result={"accuracy": 0.6}), {})
    # the job's own top-level value is the one gated
    assert _complete(_unit_operator(trained["run_path"], min_result={"accuracy": 0.6}), {"accuracy": 0.7})


@pytest.mark.parametrize("folder", ["empty", "missing"])
def test_a_folder_without_a_ray_train_run_fails_once_with_one_line(tmp_path, folder):
    run_path = tmp_path / folder
    if folder == "empty":
        run_path.mkdir()
    with pytest.raises(UserInputFailure) as err:
        _complete(_unit_operator(str(run_path)), {"accuracy": 0.9})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"train_run_path={str(run_path)!r} is invalid: ")
    assert "checkpoint_manager_snapshot.json" in message and "RunConfig storage_path" in message


@pytest.mark.long  # a real Ray Train job on the session cluster (~40 s for the module)
def test_a_run_folder_on_gcs_names_its_checkpoint_with_the_gs_scheme(trained, gcs_emulator, monkeypatch):
    import pyarrow.fs as pafs

    from tpuflow.rayjob.train_result import _filesystem
    from tpuflow.storage import EMULATOR_ENV
    from tpuflow_rehearsal.gcs_emulator import ensure_buckets

    bucket = f"tpuflow-train-{uuid.uuid4().hex[:8]}"
    ensure_buckets(gcs_emulator.url, [bucket])
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)
    run_uri = f"gs://{bucket}/runs/addition"
    gcs, gcs_path = _filesystem(run_uri)
    pafs.copy_files(trained["run_path"], gcs_path, destination_filesystem=gcs)

    result = _complete(_unit_operator(run_uri), {})
    local_checkpoint = Path(trained["result"]["checkpoint"]).name
    assert result == {
        "checkpoint": f"{run_uri}/{local_checkpoint}",
        "metrics": {"step": 2, "accuracy": 0.5},
        "train_run_path": run_uri,
    }
    with pytest.raises(UserInputFailure, match=r"^train_run_path='gs://.*/runs/nothing' is invalid: "):
        _complete(_unit_operator(f"gs://{bucket}/runs/nothing"), {})


@pytest.mark.long  # a real Ray Train job on the session cluster (~40 s for the module)
def test_a_run_whose_snapshot_records_no_checkpoint_fails_once_with_one_line(trained, tmp_path):
    """The real run's snapshot with its checkpoints taken out: a train loop that reported metrics only."""
    import json
    import shutil

    run_path = tmp_path / "metrics_only"
    shutil.copytree(trained["run_path"], run_path)
    snapshot = run_path / "checkpoint_manager_snapshot.json"
    state = json.loads(snapshot.read_text())
    state.update(checkpoint_results=[], checkpoint_report_indices=[], latest_checkpoint_result=None)
    snapshot.write_text(json.dumps(state))
    with pytest.raises(UserInputFailure) as err:
        _complete(_unit_operator(str(run_path)), {})
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(
        f"train_run_path={str(run_path)!r} is invalid: the Ray Train run recorded no checkpoint"
    )
