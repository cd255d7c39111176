"""`tpuflow demo`: run the local pipeline end to end through Airflow (`airflow dags test`).

`--output-root gs://BUCKET/PREFIX` writes every output to Cloud Storage as on GKE, here to a GCS
emulator: the one $STORAGE_EMULATOR_HOST names, else one started for the demo and stopped after
it (tpuflow_rehearsal.gcs_emulator). The bucket is created there if it is missing.

Interrupted (SIGINT/SIGTERM), the demo forwards the signal to `airflow dags test`, stops the local Ray
clusters and releases the slice leases its run left, stops the emulator it started, and exits 130/143 naming
what it cleaned; a second Ctrl-C kills at once (tpuflow_rehearsal.supervise). Killed with SIGKILL, its child is
killed with it, and what is left names the dead demo as its supervisor: the next run takes the lease over and
`tpuflow reap` removes the rest. While the run waits for a slice lease, the demo says who holds it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

from tpuflow.cost.goodput import ledger_lines
from tpuflow.errors import UserInputError
from tpuflow.validation import check_date, check_folder, check_seconds
from tpuflow_rehearsal.dag_progress import DagTestProgress, airflow_log, following, say
from tpuflow_rehearsal.demo_env import REPO, demo_env, demo_storage
from tpuflow_rehearsal.supervise import (
    LeaseWaitReporter,
    Supervisor,
    release_supervised_leases,
    reporting_lease_waits,
    stop_supervised_clusters,
)

DAG_ID = "tpu_llm_pipeline_local"


@contextlib.contextmanager
def supervised(who: str = "tpuflow demo") -> Iterator[Supervisor]:
    """The command's Supervisor: its children name it as their run's supervisor ($TPUFLOW_SUPERVISOR); on a
    signal it stops the clusters and releases the leases its run left."""
    # grace: `airflow dags test` answers SIGTERM with the task's on_kill() and goes on running the DAG's
    # teardowns; past 15 s its group is killed and the demo's own teardowns finish the job.
    with Supervisor(who, grace=15.0) as sup:
        sup.add_teardown(lambda: release_supervised_leases(sup.record))
        sup.add_teardown(lambda: stop_supervised_clusters(sup.record))  # first: a cluster before its lease
        before = {name: os.environ.get(name) for name in sup.env()}
        os.environ.update(sup.env())
        try:
            yield sup
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


# The pipeline Param each demo flag becomes (the run's conf): checked by the Param schema before Airflow starts.
FLAG_PARAMS = {
    "framework": "--framework",
    "accelerator": "--accelerator",
    "topology": "--topology",
    "machine_type": "--machine-type",
    "num_slices": "--num-slices",
    "preflight": "--no-preflight",
    "train_steps": "--train-steps",
    "checkpoint_every": "--checkpoint-every",
    "keep_endpoint": "--keep-endpoint",
    "idle_timeout": "--idle-timeout",
    "accuracy_threshold": "--accuracy-threshold",
    "num_train": "--num-train",
    "serve_topology": "--serve-topology",
}


def demo_conf(args: argparse.Namespace) -> dict[str, Any]:
    """The run's conf from the flags, checked as the pipeline checks its Params (the same functions),
    before anything starts; a bad flag is a UserInputError naming it (one line, exit 2)."""
    from tpuflow.pipeline.params import START_DATE, check_conf, validate_params

    conf: dict[str, Any] = {
        "framework": args.framework,
        "accelerator": args.accelerator,
        "topology": args.topology,
        "machine_type": args.machine_type or "",
        "num_slices": args.num_slices,
        "preflight": args.preflight,
        "train_steps": args.train_steps,
        "checkpoint_every": args.checkpoint_every,
        "keep_endpoint": args.keep_endpoint,
        "idle_timeout": args.idle_timeout,
        "accuracy_threshold": args.accuracy_threshold,
        "num_train": args.num_train,
        "serve_topology": args.serve_topology,
    }
    if args.idle_timeout and not args.keep_endpoint:
        raise UserInputError("--idle-timeout", args.idle_timeout, "it stops a kept endpoint: add --keep-endpoint")
    try:
        params = check_conf(conf)
        if args.backend == "gke":
            from tpuflow.pipeline.gke import check_gke_params

            check_gke_params(params)
        else:
            validate_params(params)
    except UserInputError as err:
        name = err.field.removeprefix("params.")
        raise UserInputError(FLAG_PARAMS.get(name, err.field), err.value, err.fix) from None
    check_seconds("--operation-seconds", args.operation_seconds, allow_zero=True, maximum=3600)
    check_date_flag(args.date, START_DATE.date())
    check_folder("--work-dir", args.work_dir)
    check_output_root_flag(args.output_root)
    return conf


def check_date_flag(value: str | None, start: date) -> None:
    """``--date``: strictly YYYY-MM-DD (the run's output folder is named so), on or after the DAG's start."""
    if value is None:
        return
    check_date("--date", value)
    if date.fromisoformat(value) < start:  # Airflow would run no task and call it a success
        raise UserInputError("--date", value, f"give a date on or after the DAG's start_date, {start:%Y-%m-%d}")


def check_output_root_flag(value: str | None) -> None:
    """``--output-root``: a gs:// URI must name a valid bucket (a folder is made when the run starts)."""
    if value and (value.startswith("gs:") or "://" in value):
        from tpuflow.storage import split_gs_uri

        split_gs_uri(value, "--output-root")


def local_output_root(work: Path, output_root: str | None) -> str:
    """Where a run writes: ``output_root`` (a gs:// URI as given), else WORK/outputs; a folder made absolute."""
    root = (output_root or str(work / "outputs")).rstrip("/")
    if not root.startswith("gs:") and "://" not in root:
        root = str(Path(root).resolve())  # gs:/... stays as given: check_params rejects it
    return root


def _run(args: argparse.Namespace) -> int:
    conf = demo_conf(args)
    with supervised() as sup:
        if args.backend == "gke":
            from tpuflow_rehearsal.demo_gke import run_gke

            return run_gke(args, conf)
        work = Path(args.work_dir).resolve()
        home = work / "airflow"
        home.mkdir(parents=True, exist_ok=True)
        output_root = local_output_root(work, args.output_root)
        with demo_storage(output_root, sup) as storage_env:
            return _run_pipeline(args, home, output_root, storage_env, conf, sup)


def _run_pipeline(
    args: argparse.Namespace,
    home: Path,
    output_root: str,
    storage_env: dict[str, str],
    conf: dict[str, Any],
    sup: Supervisor,
) -> int:
    env = {**demo_env(home, output_root), **storage_env, **sup.env(), **max_slices_env(args.num_slices)}
    run_date = args.date or date.today().isoformat()
    log = None if args.verbose else airflow_log(home, run_date)
    code, elapsed = dags_test(sup, env, DAG_ID, run_date, conf, who="tpuflow demo", num_slices=args.num_slices, log=log)
    report = read_report(output_root, DAG_ID, run_date) if code == 0 else None
    if report is None:
        where = f"Airflow's whole log: {log}" if log else "the task logs above"
        print(f"\ntpuflow demo: the pipeline FAILED after {elapsed:.0f}s ({where})", file=sys.stderr)
        return 1
    print(f"\n=== tpuflow demo: pipeline succeeded in {elapsed:.0f}s ===")
    print(f"outputs:            {report['output_dir']}")
    # each line of a step the run had: report.json has no keys of a step the workload lacks
    if report.get("accuracy") is not None:
        print(f"held-out accuracy:  {report['accuracy']:.3f} on {report.get('heldout_examples')} problems")
    if "sample_completion" in report:
        print(f"sample completion:  {report.get('sample_prompt')!r} -> {report['sample_completion']!r}")
    for line in ledger_lines(report.get("ledger")):
        print(line)
    endpoint = (report.get("ledger") or {}).get("endpoint") or {}
    if endpoint.get("stopped"):
        print(f"endpoint (stopped): {endpoint['reason']}")
    elif args.keep_endpoint and report.get("endpoint"):
        print(f"endpoint (kept):    {report['endpoint']}  (stop it with: tpuflow local down)")
    return 0


def max_slices_env(num_slices: int) -> dict[str, str]:
    """The run's own lease limit (the Variable tpuflow_max_slices, default 1): room for every slice it trains on."""
    return {"AIRFLOW_VAR_TPUFLOW_MAX_SLICES": str(num_slices)} if num_slices > 1 else {}


def dags_test(
    sup: Supervisor,
    env: dict[str, str],
    dag_id: str,
    run_date: str,
    conf: dict[str, Any],
    *,
    who: str,
    num_slices: int,
    log: Path | None = None,
) -> tuple[int, float]:
    """``airflow dags test`` of ``dag_id`` in the Airflow home ``env`` names (migrated first), supervised, saying who
    holds the slice lease while the run waits for one; its exit code and how long it ran (seconds). With ``log``,
    Airflow's output goes to that file and only the run's progress is printed (tpuflow_rehearsal.dag_progress), with the
    failed task's last log lines if it failed; without, the output streams here as it comes (--verbose)."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    sup.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    print(f"{who}: running {dag_id} for {run_date} with {json.dumps(conf)}", flush=True)
    if log is not None:
        print(f"{who}: Airflow's log: {log}", flush=True)
    started = time.time()
    reporter = LeaseWaitReporter(
        sup.record, slots=_lease_slots(env), count=num_slices, lease_root=env.get("TPUFLOW_SLICE_LEASES")
    )
    argv = [airflow, "dags", "test", dag_id, run_date, "-c", json.dumps(conf)]
    with contextlib.ExitStack() as stack:
        progress: DagTestProgress | None = None
        if log is None:
            proc = sup.popen(argv, env=env)
        else:
            log.parent.mkdir(parents=True, exist_ok=True)
            output = stack.enter_context(log.open("w"))
            proc = sup.popen(argv, env=env, stdout=output, stderr=subprocess.STDOUT)
            progress = stack.enter_context(following(log, say))
        with reporting_lease_waits(reporter):  # started after the fork: a preexec_fn and threads do not mix
            code = proc.wait()
    if progress is not None and code != 0:
        for line in progress.failure_lines():
            print(line, file=sys.stderr)
    sup.check()
    return code, time.time() - started


def read_report(output_root: str, dag_id: str, run_date: str) -> dict[str, Any] | None:
    """The run's report.json (local or gs://); None when the run wrote none."""
    from tpuflow.storage import read_text

    text = read_text(f"{output_root}/{dag_id}/{run_date}/report.json")
    return json.loads(text) if text else None


def _lease_slots(env: dict[str, str]) -> int:
    """The slice lease limit the run will see (the Variable tpuflow_max_slices through its env var, default 1)."""
    try:
        return max(1, int(env.get("AIRFLOW_VAR_TPUFLOW_MAX_SLICES", "1")))
    except ValueError:
        return 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("demo", help="run the local pipeline end to end (embedded Ray, simulated TPU slice)")
    parser.add_argument("--framework", default="jax", choices=("jax", "torch"))
    parser.add_argument("--accelerator", default="TPU-V6E")
    parser.add_argument("--topology", default="4x4")
    parser.add_argument("--machine-type", default="")
    parser.add_argument("--num-slices", type=int, default=1, help="identical slices to train across (one lease each)")
    parser.add_argument(
        "--no-preflight", dest="preflight", action="store_false", help="skip the slice preflight before training"
    )
    parser.add_argument("--train-steps", type=int, default=1500)
    parser.add_argument(
        "--checkpoint-every", type=int, default=500, help="steps between checkpoints (a preempted run resumes there)"
    )
    parser.add_argument("--num-train", type=int, default=20000, help="training examples")
    parser.add_argument("--accuracy-threshold", type=float, default=0.9, help="quality gate on held-out accuracy")
    parser.add_argument(
        "--serve-topology",
        default="",
        help="the endpoint's slice: empty = one host of the training slice; the training topology (e.g. 4x4) "
        "serves one model from all its hosts (one JAX mesh over the slice)",
    )
    parser.add_argument("--keep-endpoint", action="store_true", help="leave the cluster and Serve endpoint running")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="with --keep-endpoint: serve until this many minutes pass without a request, then tear down "
        "(the demo waits for it)",
    )
    add_run_arguments(
        parser,
        verbose_help="stream Airflow's whole log here (default: a line per task and the training's progress; the log "
        "goes to WORK_DIR/airflow/logs/dags-test-DATE.log)",
        work_dir=REPO / ".tpuflow",
        work_dir_shown=".tpuflow/",
        outputs_of="the demo",
        backend_help="local: tpu_llm_pipeline_local on embedded Ray; gke: tpu_llm_pipeline_gke on the GKE and "
        "Kubernetes stand-ins (simulated KubeRay, real local Ray clusters), all stopped afterwards",
    )
    parser.set_defaults(func=_run)


def add_run_arguments(
    parser: argparse.ArgumentParser,
    *,
    verbose_help: str,
    work_dir: Path,
    work_dir_shown: str,
    outputs_of: str,
    backend_help: str,
) -> None:
    """The flags ``tpuflow demo`` and ``tpuflow run`` share: the run's date, its log, its folders, the backend and
    how ``--backend gke`` plays GKE (what differs is each command's wording and default folder)."""
    parser.add_argument("--date", default=None, help="logical date YYYY-MM-DD (default today)")
    parser.add_argument("--verbose", action="store_true", help=verbose_help)
    parser.add_argument(
        "--work-dir", default=str(work_dir), help=f"Airflow home and outputs (default {work_dir_shown})"
    )
    parser.add_argument(
        "--output-root",
        default=None,
        help="where outputs go: a folder, or gs://BUCKET/PREFIX on the GCS emulator at $STORAGE_EMULATOR_HOST (else "
        f"one started for {outputs_of}); default WORK_DIR/outputs",
    )
    parser.add_argument("--backend", default="local", choices=("local", "gke"), help=backend_help)
    parser.add_argument(
        "--operation-seconds", type=float, default=2.0, help="--backend gke: how long each node-pool operation takes"
    )
    parser.add_argument(
        "--control-plane",
        default="real",
        choices=("real", "imitation"),
        help="--backend gke: real (default): etcd, kube-apiserver, the KubeRay operator built from Go modules (make "
        "controlplane), GKE's nodes played by the node agent (needs root); imitation: the Python Kubernetes API and "
        "simulated KubeRay",
    )
