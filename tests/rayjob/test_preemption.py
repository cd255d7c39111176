"""A simulated TPU host is preempted mid-training with every output in Cloud Storage (the GCS emulator), as
on GKE: training resumes from the bucket's latest checkpoint, loses at most one checkpoint interval, and
the model still passes the accuracy gate.

It runs on the session's two v6e 2x4 slices (tests/conftest.py): the host preempted is a host of the slice
the trainer reserved, and it comes back, so the session's cluster stays whole."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Any

import pytest
from support.gcs_bucket import list_bucket
from support.ray_cluster import alive_actors, slice_index, slice_of_node
from support.workload_operators import IN_THE_WORKER, addition_prep, addition_train
from tpuflow.workloads.tpuflow_driver.goodput import FLUSH_S

from tpuflow.cost.goodput import run_goodput, slice_timeline, summary_line
from tpuflow.rayjob.operators import RaySubmitJobOperator
from tpuflow.rayjob.workload_operators import RayTrainOperator
from tpuflow.storage import EMULATOR_ENV, read_text
from tpuflow_rehearsal.gcs_emulator import ensure_buckets

pytestmark = pytest.mark.slow
# The model's loss is near zero by step 500 (the demo's logs): 900 steps still meet the gate after a resume.
CHECKPOINT_EVERY = 150
NUM_STEPS = 900


def _demo_training(
    slice_cluster, gcs_emulator, fresh_context, monkeypatch, prefix: str, run_name: str, config: dict
) -> tuple[str, str, str, RayTrainOperator]:
    """The demo's data prepared in a fresh bucket of the GCS emulator, and its jax training on the session's
    first v6e 2x4 slice shape with ``config``, keeping its log there: (bucket, root, log URI, train operator)."""
    bucket = f"tpuflow-{prefix}-{uuid.uuid4().hex[:8]}"
    ensure_buckets(gcs_emulator.url, [bucket])
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)  # gs:// here, and in the jobs the operators submit
    root = f"gs://{bucket}/{prefix}"
    info = slice_cluster.connection_info()
    addition_prep(info, f"{root}/data", num_train=20000).execute(fresh_context("prep"))
    log_uri = f"{root}/logs/train-jax.log"
    train = addition_train(
        info,
        {"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t"},
        f"{root}/data",
        f"{root}/train",
        run_name,
        train_loop_config=config,
        log_uri=log_uri,
    )
    return bucket, root, log_uri, train


def _checkpoints(bucket: str, prefix: str) -> dict[str, int]:
    """checkpoint folder -> step, from each checkpoint's meta.json in the bucket."""
    return {
        name.rsplit("/", 1)[0]: json.loads(read_text(f"gs://{bucket}/{name}") or "{}")["step"]
        for name in list_bucket(bucket, prefix)
        if name.endswith("/meta.json")
    }


@pytest.mark.long  # prep and 900 steps of the demo (4-7 min on 2 cores): make test preempts a team's own loop whose
# checkpoints are in a bucket (below), resuming from the bucket's checkpoint
def test_preempted_host_resumes_from_the_buckets_checkpoint_and_passes_the_gate(
    slice_cluster, gcs_emulator, fresh_context, monkeypatch
):
    bucket, root, log_uri, train = _demo_training(
        slice_cluster, gcs_emulator, fresh_context, monkeypatch, "drill", "preempt",
        {"num_steps": NUM_STEPS, "checkpoint_every": CHECKPOINT_EVERY},
    )  # fmt: skip
    info = slice_cluster.connection_info()
    ctx = fresh_context("train")
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(result=train.execute(ctx)), daemon=True)
    worker.start()

    hook = train.hook()
    sid = train.base_submission_id(ctx)
    deadline = time.time() + 600
    preempted_at = None
    while time.time() < deadline and worker.is_alive():
        steps = [int(s) for s in re.findall(r"\[train_jax\] step (\d+)/", _logs(hook, sid))]
        if (
            steps
            and max(steps) >= 2 * CHECKPOINT_EVERY + 100
            and len(_checkpoints(bucket, "drill/train/preempt/")) >= 2
        ):
            preempted_at = max(steps)
            (training,) = {
                slice_of_node(slice_cluster)[a["node_id"]] for a in alive_actors(slice_cluster, "RayTrainWorker")
            }
            slice_cluster.preempt_host(slice_index(slice_cluster, training), 1, restart_after=2)
            break
        time.sleep(1)
    assert preempted_at is not None, "training never got past two checkpoints"
    worker.join(timeout=900)
    assert "result" in outcome, f"training did not finish: {_logs(hook, sid)[-3000:]}"
    result = outcome["result"]
    assert result["resumed"] is True

    kept = read_text(log_uri) or ""  # the driver log, kept in the bucket
    resumed = [int(s) for s in re.findall(r"resumed from checkpoint \S+ at step (\d+)", kept)]
    assert resumed, "the kept log must say which checkpoint training resumed from"
    assert re.search(rf"resumed from checkpoint {bucket}/drill/train/preempt/checkpoint_\S+ at step", kept)
    assert preempted_at - resumed[-1] <= CHECKPOINT_EVERY + 100  # lost at most one interval (+ log granularity)
    # the driver's goodput: the steps the first attempt logged past the checkpoint were computed again (the
    # resumed attempt's first step is its compile), and their time is named. The kill may land just after a
    # save, when nothing was redone: then no time may be charged to it either.
    first_attempt = kept.split("resumed from checkpoint", 1)[0]
    reached = max(int(s) for s in re.findall(r"\[train_jax\] step (\d+)/", first_attempt))
    measured = result["goodput"]
    assert measured["attempts"] == 2 and measured["seconds"]["preemption"] > 0
    redone = measured["steps"].get("redone", 0)
    # the recorder knows the first attempt's steps up to its last send (at most FLUSH_S before the kill):
    # every step after the checkpoint up to there is redone (the resumed attempt's first is its compile)
    recorded_to = measured["recorded"][0]["to"]
    assert redone == max(0, recorded_to - resumed[-1] - 1) <= CHECKPOINT_EVERY + 100
    late = 2 * FLUSH_S / measured["checkpoint"]["mean_step_s"] + 2  # steps one send can lag, twice over
    assert reached - late <= recorded_to, (reached, recorded_to, late)
    assert (measured["seconds"].get("redone", 0) > 0) == (redone > 0)
    assert max(_checkpoints(bucket, "drill/train/preempt/").values()) == NUM_STEPS

    evaluation = RaySubmitJobOperator(
        task_id="evaluate",
        cluster=info,
        deferrable=False,
        poll_interval=0.5,
        entrypoint=f"python -m addition.evaluate --framework jax --checkpoint {result['checkpoint']} "
        f"--data {root}/data/heldout --output {root}/eval/jax.json",
        min_result={"accuracy": 0.9},
    ).execute(fresh_context("evaluate"))
    assert evaluation["accuracy"] >= 0.9
    assert json.loads(read_text(f"{root}/eval/jax.json") or "{}")["accuracy"] == evaluation["accuracy"]


def _train_preempted_with_notice(slice_cluster, train, ctx, step_pattern: str, host: int) -> tuple[dict, Any, str]:
    """Run ``train``; once its log shows step 100, preempt ``host`` of its slice with a NOTICE_S notice (a
    replacement joins 2 s after the kill); returns (outcome with the result, the job hook, the submission id)."""
    outcome: dict = {}
    hook, sid = train.hook(), train.base_submission_id(ctx)
    # Ray's job client loaded here first: two threads loading Ray's runtime_env modules at once (this one to read
    # the log, the task's to ship its code) can see one half-initialised
    _logs(hook, sid)
    worker = threading.Thread(target=lambda: outcome.update(result=train.execute(ctx)), daemon=True)
    worker.start()
    drained: list[float] = []
    deadline = time.time() + 600
    while time.time() < deadline and worker.is_alive() and not drained:
        steps = [int(s) for s in re.findall(step_pattern, _logs(hook, sid))]
        if steps and max(steps) >= 100:
            (training,) = {
                slice_of_node(slice_cluster)[a["node_id"]] for a in alive_actors(slice_cluster, "RayTrainWorker")
            }
            slice_cluster.preempt_host(
                slice_index(slice_cluster, training),
                host,
                restart_after=2,
                notice_s=NOTICE_S,
                on_drained=drained.append,
            )
        time.sleep(1)
    assert drained, "training never reached step 100"
    worker.join(timeout=900)
    assert "result" in outcome, f"training did not finish: {_logs(hook, sid)[-3000:]}"
    return outcome, hook, sid


def _logs(hook, sid: str) -> str:
    try:
        return hook.get_job_logs(sid)
    except Exception:
        return ""


# Only the last step is a periodic checkpoint: whatever survives a preemption is the notice's checkpoint.
NOTICE_S = 20
NOTICE_STEPS = 600


@pytest.mark.long  # prep and 600 steps of the demo (about 3 min): the team's loop below shows the same in `make test`
def test_preempted_host_with_notice_saves_inside_it_and_redoes_no_step(
    slice_cluster, gcs_emulator, fresh_context, monkeypatch
):
    bucket, _, log_uri, train = _demo_training(
        slice_cluster, gcs_emulator, fresh_context, monkeypatch, "notice", "notice",
        {"num_steps": NOTICE_STEPS, "checkpoint_every": NOTICE_STEPS, "log_every": 10},
    )  # fmt: skip
    outcome, hook, sid = _train_preempted_with_notice(
        slice_cluster, train, fresh_context("train"), r"\[train_jax\] step (\d+)/", host=1
    )
    assert outcome["result"]["resumed"] is True

    kept = read_text(log_uri) or ""
    (noticed,) = [int(s) for s in re.findall(r"preemption notice at step (\d+): checkpoint saved", kept)]
    (resumed,) = [int(s) for s in re.findall(r"resumed from checkpoint \S+ at step (\d+)", kept)]
    assert resumed == noticed  # the notice's checkpoint is the one resumed from
    before_restart = kept[: kept.index("resumed from checkpoint")]
    computed = max(int(s) for s in re.findall(r"\[train_jax\] step (\d+)/", before_restart))
    assert computed <= noticed  # no step after the notice's checkpoint: none is computed twice
    saved = _checkpoints(bucket, "notice/train/notice/")
    assert sorted(saved.values()) == [noticed, NOTICE_STEPS]


# A team's own loop (not the demo's): a counter checkpointed as JSON, saving inside the notice with the
# documented helper, shipped as its working_dir the way `ray job submit --working-dir` ships code.
ACME_LOOP = """\
import json
import os
import tempfile
import time


def train(config):
    import ray.train
    from tpuflow_driver.goodput import StepClock
    from tpuflow_driver.preemption import PreemptionNotice

    clock = StepClock.for_worker()
    rank = ray.train.get_context().get_world_rank()
    step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as f:
                step = json.load(f)["step"]
        if rank == 0:
            print(f"acme resumed at {step}", flush=True)

    def save(at):
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                with open(os.path.join(folder, "state.json"), "w") as f:
                    json.dump({"step": at}, f)
            chosen = ray.train.Checkpoint.from_directory(folder) if rank == 0 else None
            ray.train.report({"step": at}, checkpoint=chosen)

    notice = PreemptionNotice()
    clock.begin(step)
    while step < int(config["num_steps"]):
        time.sleep(0.05)
        step += 1
        clock.step(step)
        if rank == 0:
            print(f"acme computed {step}", flush=True)
        if notice.arrived():
            save(step)
            clock.mark("checkpoint")
            if rank == 0:
                print(f"acme notice at {step}", flush=True)
            clock.flush()
            notice.hold()
    save(step)
    clock.mark("checkpoint")
    clock.flush()
"""


def test_a_teams_own_loop_saves_inside_the_notice_with_the_helper(
    slice_cluster, gcs_emulator, fresh_context, monkeypatch, tmp_path
):
    """A team's loop with tpuflow's notice helper, its checkpoints in a bucket (the GCS emulator) as on GKE: the host
    preempted with notice, the loop saves inside it and resumes from the bucket's checkpoint at that step."""
    bucket = f"tpuflow-acme-{uuid.uuid4().hex[:8]}"
    ensure_buckets(gcs_emulator.url, [bucket])
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)
    code = tmp_path / "code"
    (code / "acme_counter").mkdir(parents=True)
    (code / "acme_counter" / "__init__.py").write_text("")
    (code / "acme_counter" / "loop.py").write_text(ACME_LOOP)
    train = RayTrainOperator(
        task_id="fit_counter",
        cluster=slice_cluster.connection_info(),
        framework="jax",
        train_loop="acme_counter.loop:train",
        tpu_slice={"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t"},
        storage_path=f"gs://{bucket}/runs",
        run_name="counter",
        working_dir=str(code),
        train_loop_config={"num_steps": 600},
        **IN_THE_WORKER,
    )
    ctx = fresh_context("fit_counter")
    outcome, hook, sid = _train_preempted_with_notice(slice_cluster, train, ctx, r"acme computed (\d+)", host=0)
    logs = _logs(hook, sid)
    (noticed,) = [int(s) for s in re.findall(r"acme notice at (\d+)", logs)]
    (resumed,) = [int(s) for s in re.findall(r"acme resumed at (\d+)", logs)]
    before = logs[: logs.index("acme resumed at")]
    assert resumed == noticed == max(int(s) for s in re.findall(r"acme computed (\d+)", before))
    assert outcome["result"]["metrics"]["step"] == 600
    saved = [name for name in list_bucket(bucket, "runs/counter/") if name.endswith("/state.json")]
    assert len(saved) >= 2, saved  # the notice's checkpoint and the last one, in the bucket
    # the goodput the loop's StepClock measured: the notice held, then the restart, is the preemption's time
    measured = outcome["result"]["goodput"]
    assert measured["attempts"] == 2 and "redone" not in measured["steps"]
    assert measured["steps"]["productive"] + measured["steps"]["compile"] == 600
    assert measured["seconds"]["preemption"] >= NOTICE_S / 2 and measured["seconds"]["productive"] >= 600 * 0.05 * 0.9
    # and the run's goodput report names it: the task's work span, through the ledger's timeline of its slice
    span = ctx["ti"].xcoms["work_span"]
    assert span["cause"] == "training" and span["breakdown"] == measured["seconds"]
    timeline = slice_timeline(span["started_at"], span["ended_at"], [span], now=time.time())
    report = run_goodput([{"chips": 8, "timeline": timeline}])
    badput = {b["cause"]: b["chip_seconds"] for b in report["badput"]}
    assert badput["preemption"] >= 8 * NOTICE_S / 2 and "redone" not in badput
    assert "preemption" in summary_line(report), summary_line(report)  # one of the top two badput causes
