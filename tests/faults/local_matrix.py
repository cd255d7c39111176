"""The fault matrix's local rows: `tpu_llm_pipeline_local` (real local Ray clusters simulating the slice)
through dag.test(), with a task that raises once its work is done (the cluster started, the job ran, the
Serve app deployed, then the task failed on every try), or an infrastructure fault while the run goes: a
simulated TPU host preempted mid-training (two-host v6e 2x4: killed once training has checkpointed, replaced
2 s later, as GKE recreates a preempted TPU VM), and Cloud Storage answering 503/429 to some of prep's
parquet writes and train's checkpoint writes (the run's outputs on a GCS emulator, every client going through
tests/support/fault_proxy.py). Those two must recover: they are judged by the whole run, and a row whose
fault never fired fails. A storage server that stops answering during train's checkpoint upload must not
recover but end: train fails within its deadline and retry policy, naming the stalled call.

Counted after each run: local Ray clusters still running (a state.json left, or any process naming a
cluster's temp dir), slice leases still held, and local clusters started more than once for the run or
Ray jobs a task submitted while its earlier one had not ended (duplicated). The rows join the GKE rows in
the table printed at the end of the session.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from faults.matrix import Outcome, raises_after_its_work, settled

DAG_ID = "tpu_llm_pipeline_local"
REPO = Path(__file__).resolve().parents[2]
# A one-host slice and a short training without the accuracy gate: what a case measures is the teardown.
CONF = {
    "topology": "2x2",
    "accelerator": "TPU-V6E",
    "framework": "jax",
    "train_steps": 300,
    "num_train": 3000,
    "accuracy_threshold": 0,
}
# A host lost while others remain: the two-VM form of v6e 2x4 (two 4-chip hosts).
TWO_HOSTS = {"topology": "2x4", "machine_type": "ct6e-standard-4t"}


@dataclass
class LocalDrill:
    """What a case's `during` hook acts on while the run goes, and what it saw."""

    home: Path  # TPUFLOW_HOME of the run: its clusters, leases and (by default) outputs
    tmp_path: Path
    monkeypatch: pytest.MonkeyPatch
    started: list[Any]  # the LocalRayClusters the run started
    run: Any = None  # the DagRun, once dag.test() returned
    fired: list[str] = field(default_factory=list)  # each fault that really hit the run, in words
    notes: list[str] = field(default_factory=list)  # what the hook saw otherwise, for the assertion message

    def xcom(self, task_id: str) -> Any:
        (ti,) = [ti for ti in self.run.get_task_instances() if ti.task_id == task_id]
        return ti.xcom_pull(task_ids=task_id)


@dataclass(frozen=True)
class LocalFaultCase:
    stage: str  # the task the fault hits ("a+b": several)
    fault: str
    patch_dag: Callable[[Any], None]
    recovers: bool = False
    ci: bool = False
    conf: dict[str, Any] = field(default_factory=dict)  # on top of CONF
    # entered before the DAG file is parsed (it may set the environment the DAG reads) and left once the run
    # ended: it injects the fault while the run goes, and records in the drill whether it fired
    during: Callable[[LocalDrill], AbstractContextManager[None]] | None = None

    pipeline = "local"

    @property
    def id(self) -> str:
        return f"local-{self.stage}-{self.fault}"


@contextmanager
def started_clusters(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every LocalRayCluster the run starts (the tasks run in this process under dag.test)."""
    from tpuflow.local.cluster import LocalRayCluster

    started: list[Any] = []
    start = LocalRayCluster.start.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, *args: Any, **kwargs: Any) -> Any:
        cluster = start(cls, *args, **kwargs)
        started.append(cluster)
        return cluster

    monkeypatch.setattr(LocalRayCluster, "start", classmethod(recording))
    yield started


@contextmanager
def submitted_jobs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every Ray job the run's tasks submit: (task id, how many earlier jobs of that task had not ended)."""
    from tpuflow.rayjob.hooks import RayJobHook

    submitted: list[tuple[str, int]] = []
    submit = RayJobHook.submit_job

    def recording(self: Any, entrypoint: str, submission_id: str, *args: Any, **kwargs: Any) -> str:
        earlier = self.find_jobs(re.sub(r"-r\d+$", "", submission_id))
        live = sum(1 for job in earlier if str(getattr(job.status, "value", job.status)) in ("PENDING", "RUNNING"))
        submitted.append((str((kwargs.get("metadata") or {}).get("airflow_task")), live))
        return submit(self, entrypoint, submission_id, *args, **kwargs)

    monkeypatch.setattr(RayJobHook, "submit_job", recording)
    yield submitted


@contextmanager
def local_dag_in_folder(dags_folder: Path) -> Iterator[None]:
    path = dags_folder / f"{DAG_ID}.py"
    linked = not path.exists()
    if linked:
        path.symlink_to(REPO / "dags" / f"{DAG_ID}.py")
    try:
        yield
    finally:
        if linked:
            path.unlink(missing_ok=True)


@contextmanager
def no_fault_during(drill: LocalDrill) -> Iterator[None]:
    yield


def run_local_case(case: LocalFaultCase, dags_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    from airflow.dag_processing.dagbag import DagBag
    from support.gke_pipeline import task_states

    home = tmp_path / "home"
    monkeypatch.setenv("TPUFLOW_HOME", str(home))
    monkeypatch.delenv("TPUFLOW_OUTPUT_ROOT", raising=False)  # outputs under the home
    monkeypatch.delenv("TPUFLOW_SLICE_LEASES", raising=False)  # leases under the home
    with (
        local_dag_in_folder(dags_folder),
        started_clusters(monkeypatch) as started,
        submitted_jobs(monkeypatch) as jobs,
    ):
        drill = LocalDrill(home, tmp_path, monkeypatch, started)
        try:
            with (case.during or no_fault_during)(drill):
                bag = DagBag(dag_folder=str(dags_folder / f"{DAG_ID}.py"))
                assert bag.import_errors == {}, bag.import_errors
                dag = bag.get_dag(DAG_ID)
                for op in dag.tasks:
                    if hasattr(op, "poll_interval"):
                        op.poll_interval = 1.0
                case.patch_dag(dag)
                drill.run = run = dag.test(run_conf={**CONF, **case.conf})
                states = task_states(run)
        finally:
            left = _leftovers(home, started)
            for cluster in started:  # whatever the verdict, nothing stays up on the machine
                cluster.stop()
    per_task = Counter(task for task, _ in jobs)
    made = {"local_clusters": len(started), **{f"ray_jobs:{t}": n for t, n in per_task.items()}}
    if case.during is not None:
        made["faults_fired"] = len(drill.fired)
    return Outcome(
        case,
        "/".join(states.get(stage, "absent") for stage in case.stage.split("+")),
        left,
        {"local_clusters": max(0, len(started) - 1), "ray_jobs": sum(live for _, live in jobs)},
        made,
        # a recovery is the whole run succeeding, not only the stage the fault hit
        run_state=str(run.state) if case.recovers else None,
        explanation="\n".join(drill.fired + drill.notes),
    )


def _leftovers(home: Path, started: list[Any]) -> dict[str, int]:
    from tpuflow.local.cluster import _pids_referencing

    def count() -> dict[str, int]:
        return {
            "local_clusters": len(list((home / "clusters").glob("*/state.json"))),
            "ray_processes": sum(len(_pids_referencing(c.temp_dir)) for c in started),
            "slice_leases": len(list((home / "slice-leases").rglob("slot-*.json"))),
        }

    return settled(count)


def checkpoint_every(steps: int) -> Callable[[Any], None]:
    """Train checkpoints every `steps` steps (no Param sets it: the pipeline keeps the workload's 500)."""

    def patch(dag: Any) -> None:
        train = dag.get_task("train")
        train.train_loop_config = {**train.train_loop_config, "checkpoint_every": steps}

    return patch


def _checkpoints(home: Path) -> list[Path]:
    """train's checkpoint folders under the run's (local) output root (not Ray Train's checkpoint_manager_snapshot)."""
    return sorted(p for p in home.glob("outputs/*/*/train/*/checkpoint_*") if p.is_dir())


@contextmanager
def host_lost_mid_training(drill: LocalDrill) -> Iterator[None]:
    """Once train's job has written two checkpoints (so the first is complete), preempt host 1 of the slice
    its workers train on; it comes back 2 s later. Fired when train's result says Ray Train lost that host
    and resumed from a checkpoint (training had not ended first)."""
    import requests
    from support.ray_cluster import alive_actors, slice_index, slice_of_node

    stop = threading.Event()
    lost: list[str] = []

    def watch() -> None:
        training, index = "", 0  # the slice train's workers run on, found while they compile (tens of seconds)
        while not stop.wait(0.2):
            if not drill.started:
                continue
            cluster = drill.started[0]
            if not training:
                try:
                    nodes = slice_of_node(cluster)
                    training = next(iter({nodes[a["node_id"]] for a in alive_actors(cluster, "RayTrainWorker")}), "")
                    index = slice_index(cluster, training) if training else 0
                except requests.RequestException:
                    training = ""
            # once compiled, the 2x4 trains 600 steps in seconds: kill at once, without asking Ray again
            elif len(_checkpoints(drill.home)) >= 2:
                drill.notes.append(f"preempting {training}/worker-1 at {[p.name for p in _checkpoints(drill.home)]}")
                try:
                    cluster.preempt_host(index, 1, restart_after=2)
                except Exception as err:  # the replacement never joined: said in the assertion message
                    drill.notes.append(f"preempt_host failed: {err!r}")
                    return
                lost.append(training)
                return

    watcher = threading.Thread(target=watch, name="host-lost", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=300)  # a replacement host still starting: before the clusters are stopped
    if not lost:
        drill.notes.append("no host was preempted: train never had two checkpoints while its workers ran")
        return
    train = drill.xcom("train") or {}
    drill.notes.append(f"train returned hosts_lost={train.get('hosts_lost')} resumed={train.get('resumed')}")
    if {"slice": lost[0], "worker": "1"} in train.get("hosts_lost", []) and train.get("resumed"):
        drill.fired.append(f"{lost[0]} lost worker 1 mid-training; Ray Train resumed from a checkpoint")


@contextmanager
def gcs_errors_on_writes(drill: LocalDrill) -> Iterator[None]:
    """The run's outputs on gs:// (a GCS emulator of the case's own), every client (this process, the
    cluster's nodes and its jobs, which inherit STORAGE_EMULATOR_HOST) going through a FaultProxy that answers
    some of prep's parquet writes and train's checkpoint writes with 503, one checkpoint write with 429.
    Fired when every rule fired."""
    from support.fault_proxy import FaultProxy, Rule, writes_to

    from tpuflow.storage import EMULATOR_ENV
    from tpuflow_rehearsal.gcs_emulator import GcsEmulator

    bucket = "tpuflow-faults"
    with ExitStack() as stack:
        emulator = GcsEmulator.start(buckets=[bucket], state_dir=drill.tmp_path / "gcs-emulator")
        stack.callback(emulator.stop)
        proxy = FaultProxy(emulator.url).start()
        stack.callback(proxy.stop)
        rules = [
            proxy.add(Rule(503, writes_to(".parquet"), every=2, limit=2)),
            proxy.add(Rule(503, writes_to("/checkpoint_"), every=3, limit=2)),
            proxy.add(Rule(429, writes_to("/checkpoint_"), every=4, limit=1)),
        ]
        drill.monkeypatch.setenv(EMULATOR_ENV, proxy.url)
        drill.monkeypatch.setenv("TPUFLOW_OUTPUT_ROOT", f"gs://{bucket}/runs")  # read when the DAG file is parsed
        yield
    injected = [f"{fault} on {method} {target.split(' ', 1)[0][:120]}" for method, target, fault in proxy.injected]
    if all(rule.fired for rule in rules):
        drill.fired.extend(injected)
    else:
        drill.notes.append(f"rules fired {[rule.fired for rule in rules]}; injected {injected}")


STALL_DEADLINE_S = 10  # TPUFLOW_GCS_REQUEST_TIMEOUT_S of the stalled-storage row


def stalled_storage_policy(dag: Any) -> None:
    """train checkpoints every 100 steps; Ray Train restarts its workers once (FailureConfig), the task does not
    retry: a policy whose worst case this row can wait for (each attempt stalls at its first checkpoint)."""
    checkpoint_every(100)(dag)
    train = dag.get_task("train")
    train.max_failures, train.retries = 1, 0


def _checkpoint_write(method: str, target: str) -> bool:
    """A write of a checkpoint's files (Ray Train's checkpoint_<time>/...), not of its manager's snapshot."""
    return method in ("POST", "PUT", "PATCH") and "/checkpoint_" in target and "checkpoint_manager" not in target


@contextmanager
def gcs_stalls_during_checkpoint_upload(drill: LocalDrill) -> Iterator[None]:
    """The run's outputs on gs:// (its own GCS emulator behind a FaultProxy, as in gcs_errors_on_writes) with
    TPUFLOW_GCS_REQUEST_TIMEOUT_S=10: every write of a checkpoint gets no answer at all (the server accepts the
    connection, reads the request, sends nothing). Fired when the stall hit train's checkpoint upload, train's
    kept driver log says which call stalled on which gs:// path, and train ended within its policy's worst
    case after the last stall began: the deadline plus the job's teardown, not a hang."""
    from support.fault_proxy import FaultProxy, Rule

    from tpuflow.storage import EMULATOR_ENV, REQUEST_TIMEOUT_ENV, gcs_client
    from tpuflow_rehearsal.gcs_emulator import GcsEmulator

    bucket = "tpuflow-faults"
    stalls: list[float] = []

    def stalled(method: str, target: str) -> bool:
        if _checkpoint_write(method, target):
            stalls.append(time.time())
            return True
        return False

    with ExitStack() as stack:
        emulator = GcsEmulator.start(buckets=[bucket], state_dir=drill.tmp_path / "gcs-emulator")
        stack.callback(emulator.stop)
        proxy = FaultProxy(emulator.url).start()
        stack.callback(proxy.stop)
        proxy.add(Rule("stall", stalled))
        drill.monkeypatch.setenv(EMULATOR_ENV, proxy.url)
        drill.monkeypatch.setenv(REQUEST_TIMEOUT_ENV, str(STALL_DEADLINE_S))  # the cluster and its jobs inherit it
        drill.monkeypatch.setenv("TPUFLOW_OUTPUT_ROOT", f"gs://{bucket}/runs")
        yield
        logs = [b for b in gcs_client().list_blobs(bucket, prefix="runs/") if b.name.endswith("/logs/train-jax.log")]
        log = logs[0].download_as_text() if logs else ""
    (train,) = [ti for ti in drill.run.get_task_instances() if ti.task_id == "train"]
    said = [line.strip() for line in log.splitlines() if "storage call stalled" in line]
    drill.notes.append(f"{len(stalls)} checkpoint writes stalled; train {train.state}; the log says {said[-1:]}")
    if not stalls or not said or f"gs://{bucket}/runs/" not in said[-1] or "/checkpoint_" not in said[-1]:
        return
    if train.end_date is None:
        return
    after_last_stall = train.end_date.timestamp() - stalls[-1]
    drill.notes.append(f"train ended {after_last_stall:.0f} s after the last stall began")
    if after_last_stall <= STALL_DEADLINE_S + 90:  # the deadline, the controller's failure handling, the job's end
        drill.fired.append(f"{len(stalls)} checkpoint writes stalled; train failed: {said[-1]}")


LOCAL_CASES: list[LocalFaultCase] = [
    LocalFaultCase("start_cluster", "exception-after-create", raises_after_its_work("start_cluster"), ci=True),
    LocalFaultCase("train", "exception-after-its-job", raises_after_its_work("train")),
    LocalFaultCase("deploy", "exception-after-deploy", raises_after_its_work("deploy")),
    LocalFaultCase(
        "train",
        "host-lost-mid-training",
        checkpoint_every(50),
        recovers=True,
        conf={**TWO_HOSTS, "train_steps": 600},
        during=host_lost_mid_training,
    ),
    LocalFaultCase(
        "prep+train", "gcs-503-429-on-writes", checkpoint_every(100), recovers=True, during=gcs_errors_on_writes
    ),
    LocalFaultCase(
        "train",
        "gcs-stalls-during-checkpoint-upload",
        stalled_storage_policy,
        during=gcs_stalls_during_checkpoint_upload,
    ),
]


def local_case_params() -> list[Any]:
    return [pytest.param(case, id=case.id, marks=() if case.ci else pytest.mark.long) for case in LOCAL_CASES]
