"""The train-and-serve pipeline as a DAG factory: one chain, several backends.

local: embedded Ray cluster with a simulated slice (default; runs on one machine).
The cluster lifecycle is the only part that differs per backend; prep, train, evaluate,
deploy and smoke test are the same operators talking to the same Ray APIs.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from airflow.sdk import DAG, BaseOperator

from tpuflow import paths, workloads_dir
from tpuflow.cost.approval import BudgetGate, ChipBudgetApprovalOperator
from tpuflow.cost.ledger import LEDGER_TASK_ID, PRICES_VARIABLE
from tpuflow.cost.operators import TPUCheckChipBudgetOperator
from tpuflow.errors import UserInputError
from tpuflow.labels import DEFAULT_EXPIRES_AFTER
from tpuflow.limits import RUN_LIMITS
from tpuflow.pipeline.params import START_DATE, pipeline_params, step_params_lacking
from tpuflow.pipeline.steps import BuildServeConfigOperator, CheckParamsOperator, WriteReportOperator
from tpuflow.pipeline.workload import Workload, templated
from tpuflow.rayjob.operators import RaySubmitJobOperator
from tpuflow.rayjob.preflight import RaySlicePreflightOperator
from tpuflow.rayjob.workload_operators import RayDataPrepOperator, RayTrainOperator
from tpuflow.serve.idle_stop import RayServeWaitForIdleOperator
from tpuflow.serve.operators import RayServeDeployOperator, ServeEndpointSmokeTestOperator
from tpuflow.slices.operators import TPUAcquireSliceOperator, TPUReleaseSliceOperator
from tpuflow.work_spans import DATA_PREP, EVALUATION, PREFLIGHT, SERVING, TRAINING

if TYPE_CHECKING:
    from airflow.sdk.definitions.xcom_arg import XComArg


class _JobCode(TypedDict, total=False):
    """A Ray job's arguments that ship the workload's code (none when its modules are importable there)."""

    runtime_env: dict[str, Any] | None


class _InTrainingGate(TypedDict, total=False):
    """The train task's quality gate when the loop evaluates (templates of the gate's minimum)."""

    min_result: dict[str, str]


# Outputs are keyed by the run's date (logical date, or run_after for manual runs without one),
# so backfilled dates never collide and a rerun of a date reuses what that date already produced.
RUN_DATE = "{{ (dag_run.logical_date or dag_run.run_after).strftime('%Y-%m-%d') }}"
# Slices the pipeline may hold at once, across schedules, UI triggers and backfills (a backfill has its
# own max_active_runs, 10 by default in Airflow 3.3): leases taken before the cluster, given back by a teardown.
MAX_SLICES = "{{ var.value.get('tpuflow_max_slices', 1) }}"
# A field of check_params' training slice (TpuSlice.to_dict()), as a template.
CHECKED_SLICE = "{{{{ ti.xcom_pull(task_ids='check_params')['{}'] }}}}"


# check_params' training slice (TpuSlice.to_dict()), a dict once rendered: the budget's and the ledger's slice.
TRAIN_SLICE = "{{ ti.xcom_pull(task_ids='check_params') }}"
# check_params' serve slice (tpuflow.pipeline.params: serve_topology), a dict once rendered.
SERVE_SLICE = "{{ ti.xcom_pull(task_ids='check_params')['serve'] }}"
# The quality gate's key when the train loop evaluates (Workload.evaluate_in_training): its reported evaluation.
IN_TRAINING_GATE = "evaluation.accuracy"


# Slice arguments the pipeline once took: the slice is each run's (Params), every slice task's tpu_slice.
SLICE_ARGUMENTS = ("accelerator", "topology", "machine_type", "num_slices", "tpu_slice")


def refuse_slice_arguments(dag_kwargs: Mapping[str, Any]) -> None:
    """One line for a slice given as a DAG argument (``accelerator=``, ``topology=``, ...), naming ``tpu_slice``
    and how a run gives its slice, instead of Airflow's TypeError on an unknown DAG argument."""
    given = [name for name in SLICE_ARGUMENTS if name in dag_kwargs]
    if not given:
        return
    spec = dag_kwargs.get("tpu_slice")
    example = dict(spec) if isinstance(spec, Mapping) else {n: dag_kwargs[n] for n in given if n != "tpu_slice"}
    example = {key: example[key] for key in SLICE_ARGUMENTS if key in example} or {"topology": "4x4"}
    raise UserInputError(
        given[0],
        dag_kwargs[given[0]],
        "the pipeline takes no slice argument: each run gives its slice as the Params accelerator, topology, "
        f"machine_type and num_slices (the trigger form, or conf {json.dumps(example, default=str)}), and "
        "check_params hands it to every slice task as tpu_slice",
    )


def checked(key: str, serve: bool = False) -> str:
    """A template for one field of check_params' slice (or of its serve slice)."""
    path = f"['serve']['{key}']" if serve else f"['{key}']"
    return "{{ ti.xcom_pull(task_ids='check_params')" + path + " }}"


def checked_slice(serve: bool = False) -> dict[str, str]:
    """The ``tpu_slice`` argument of every slice task: accelerator, topology, machine_type and num_slices of
    check_params' training (or serve) slice, as templates: every task of a run reads the one slice
    check_params validated, never the raw Params."""
    return {
        "accelerator": checked("ray_accelerator_type", serve),
        "topology": checked("topology", serve),
        "machine_type": checked("machine_type", serve),
        "num_slices": checked("num_slices", serve),
    }


def build_serve_config(
    cluster: Any,
    trained: Any,
    workloads_uri: str,
    tpu_slice: Any = None,
    *,
    workload: Workload,
    code_uri: str | None = None,
) -> XComArg:
    """The Serve config task (task_id build_serve_config) of the workload's app; its XCom is the config the
    deploy task takes.

    ``tpu_slice``: the TPU slice the replicas are placed on (check_params' ``serve``); None: CPU replicas.
    ``code_uri``: the workload's code as the cluster sees it (None: nothing shipped).
    """
    return BuildServeConfigOperator(
        task_id="build_serve_config",
        workload=workload,
        cluster=cluster,
        trained=trained,
        workloads_uri=workloads_uri,
        tpu_slice=tpu_slice,
        code_uri=code_uri,
    ).output


def pipeline_dag(
    dag_id: str,
    *,
    schedule: str | None,
    start_date: datetime,
    max_active_runs: int,
    params: dict[str, Any] | None = None,
    workload: Workload | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """The DAG settings every backend shares; the workload's own Params join the pipeline's, less those of the
    steps it does not have (tpuflow.pipeline.params.STEP_PARAMS: no task reads them, the form does not show them)."""
    refuse_slice_arguments(dag_kwargs)
    lacking = step_params_lacking(workload)
    params = {name: param for name, param in (params or pipeline_params()).items() if name not in lacking}
    for name, value in ((workload.params or {}) if workload else {}).items():
        if name in params:
            raise UserInputError(
                f"workload.params[{name!r}]", value, f"name it otherwise: the pipeline has a Param {name} already"
            )
        params[name] = value
    return DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=start_date,
        catchup=False,
        # One slice at a time: a backfill never asks for more TPU hosts than one run needs.
        max_active_runs=max_active_runs,
        params=params,
        render_template_as_native_obj=True,
        # tpuflow_limits: a Param as the admin's limits hold it (tpuflow.limits), for the tasks that read one
        user_defined_macros={**(dag_kwargs.pop("user_defined_macros", None) or {}), "tpuflow_limits": RUN_LIMITS},
        # a user's own default_args and tags are added to the pipeline's, theirs winning
        default_args={
            "retries": 1,
            "retry_delay": timedelta(seconds=10),
            **(dag_kwargs.pop("default_args", None) or {}),
        },
        tags=list(dict.fromkeys(["tpuflow", "tpu", "ray", *(dag_kwargs.pop("tags", None) or [])])),
        doc_md=dag_kwargs.pop("doc_md", __doc__),
        **dag_kwargs,
    )


def run_dir_for(dag_id: str, output_root: str | None) -> str:
    """Where one run of the DAG writes (output_root default: tpuflow.paths.output_root() when parsed)."""
    return f"{dag_dir_for(dag_id, output_root)}/{RUN_DATE}"


def dag_dir_for(dag_id: str, output_root: str | None) -> str:
    """Where the DAG's runs write, one folder each (their ledgers: the budget guard's basis)."""
    return f"{output_root or paths.output_root()}/{dag_id}"


def training_steps(
    cluster: Any,
    run_dir: str,
    *,
    workload: Workload,
    train_cluster: Any = None,
    gcp_conn_id: str = "google_cloud_default",
    **train_kwargs: Any,
) -> tuple[BaseOperator | None, BaseOperator, BaseOperator | None]:
    """prep and preflight -> train -> evaluate as Ray jobs on `cluster` (an XComArg of connection info):
    backend-independent. The preflight checks the training slice(s) right before training (Param
    ``preflight`` turns it off). Each step is the workload's; prep and evaluate are None when the
    workload has none. The workload's code_dir travels with every job (runtime_env py_modules).

    ``train_cluster``: train elsewhere (the TPU cluster, while prep and evaluate run on a CPU one: the
    evaluation then runs in one CPU actor, since the training slice is deleted once its checkpoint
    exists); ``gcp_conn_id``: the connection of a gs:// run folder (prep replaces its output there);
    ``train_kwargs``: more of RayTrainOperator's arguments (e.g. ``budget``)."""
    # On the slice: one actor per host of the training slice, each holding that host's TPU resources.
    on_slice = [
        *("--num-hosts", CHECKED_SLICE.format("num_hosts")),
        *("--tpu-per-host", CHECKED_SLICE.format("logical_devices_per_host")),
        *("--accelerator-type", CHECKED_SLICE.format("ray_accelerator_type")),
    ]
    # The workload's code, shipped with each job that runs it (none when its modules are importable there).
    code: _JobCode = {"runtime_env": workload.runtime_env()} if workload.code_dir else {}
    # evaluated by the loop after its last step: the same gate, on the train task's result
    in_training_gate: _InTrainingGate = (
        {"min_result": {IN_TRAINING_GATE: "{{ params.accuracy_threshold }}"}} if workload.evaluate_in_training else {}
    )
    prep = None
    if workload.prep:
        prep = RayDataPrepOperator(
            task_id="prep",
            cluster=cluster,
            module=templated(workload.prep),
            arguments={
                "output_dir": f"{run_dir}/data",
                "date": RUN_DATE,
                "num_train": "{{ params.num_train }}",
                "num_heldout": "{{ params.num_eval }}",
            },
            log_uri=f"{run_dir}/logs/prep.log",
            # a rerun of the date replaces the data an earlier attempt wrote, never adds to it
            replace_output_dir=True,
            gcp_conn_id=gcp_conn_id,
            **code,
        )
    slice_args = {
        "cluster": cluster if train_cluster is None else train_cluster,
        "tpu_slice": checked_slice(),
    }
    preflight = RaySlicePreflightOperator(
        task_id="preflight", enabled="{{ params.preflight }}", log_uri=f"{run_dir}/logs/preflight.log", **slice_args
    )
    train = RayTrainOperator(
        task_id="train",
        framework="{{ params.framework }}",
        train_loop=templated(workload.train_loop),
        **slice_args,
        storage_path=f"{run_dir}/train",
        run_name="{{ params.framework }}-{{ params.accelerator | lower }}-{{ params.topology }}",
        datasets={"train": f"{run_dir}/data/train"} if prep else None,
        train_loop_config={
            **(workload.train_loop_config or {}),
            "num_steps": "{{ params.train_steps }}",
            "checkpoint_every": "{{ params.checkpoint_every }}",
            **({"heldout": f"{run_dir}/data/heldout"} if workload.evaluate_in_training and prep else {}),
        },
        resume="{{ params.resume }}",
        # the DAG's folder, above the day's run_dir: tomorrow's run reads today's compiled programs back
        compilation_cache=run_dir.rsplit("/", 1)[0] if workload.compilation_cache else False,
        log_uri=f"{run_dir}/logs/train-{{{{ params.framework }}}}.log",
        **in_training_gate,
        **code,
        **train_kwargs,
    )
    # The preflight needs only the training cluster: it runs beside prep, and training waits for both.
    [*([prep] if prep else []), preflight] >> train
    if not workload.evaluate_job:
        return prep, train, None
    evaluate = RaySubmitJobOperator(
        task_id="evaluate",
        cluster=cluster,
        # An argument list: each path is one argument once rendered (shlex.join), whatever the output root holds.
        entrypoint=[
            *("python", "-m", templated(workload.evaluate_job), "--framework", "{{ params.framework }}"),
            *("--checkpoint", "{{ ti.xcom_pull(task_ids='train')['checkpoint'] }}"),
            *(("--data", f"{run_dir}/data/heldout") if prep else ()),
            *("--output", f"{run_dir}/eval/{{{{ params.framework }}}}.json"),
            *(on_slice if train_cluster is None else []),
        ],
        min_result={"accuracy": "{{ params.accuracy_threshold }}"},
        log_uri=f"{run_dir}/logs/evaluate-{{{{ params.framework }}}}.log",
        **code,
    )
    train >> evaluate
    return prep, train, evaluate


def smoke_test_and_report(
    run_dir: str,
    evaluate: BaseOperator | None,
    deploy: BaseOperator | None,
    *,
    workload: Workload,
    train: BaseOperator,
    serve_token_conn_id: str | None = None,
) -> tuple[BaseOperator | None, BaseOperator]:
    """Call the deployed endpoint (deploy's XCom carries serve_url) with the workload's smoke request, and
    write the run's report after the last step the workload has (``train`` when it has no other)."""
    smoke = None
    app = f"/{workload.app_name}"
    # smoke_expect is set whenever smoke_request is (Workload checks them together)
    if deploy is not None and workload.smoke_request is not None and workload.smoke_expect is not None:
        smoke = ServeEndpointSmokeTestOperator(
            task_id="smoke_test",
            url="{{ ti.xcom_pull(task_ids='" + deploy.task_id + "')['serve_url'] }}" + f"{app}/{workload.smoke_path}",
            payload=dict(workload.smoke_request),
            expect=workload.smoke_expect,
            serve_token_conn_id=serve_token_conn_id,
        )
    api = posixpath.dirname(workload.smoke_path) if smoke else ""
    evaluation: Any = evaluate.output if evaluate else None
    if workload.evaluate_in_training:
        evaluation = "{{ ti.xcom_pull(task_ids='" + train.task_id + "')['evaluation'] }}"
    report = WriteReportOperator(
        task_id="write_report",
        output_dir=run_dir,
        evaluation=evaluation,
        answer=smoke.output if smoke else None,
        deployed=deploy.output if deploy else None,
        sample_prompt=workload.smoke_request.get("prompt") if smoke and workload.smoke_request else None,
        endpoint_path=f"{app}/{api}".rstrip("/") if deploy else "",
    )
    if deploy is not None and smoke is not None:
        deploy >> smoke
    (smoke or deploy or evaluate or train) >> report
    return smoke, report


# Keep the endpoint only when it was actually serving; a failed run never leaves a cluster behind.
KEEP_ENDPOINT = "{{ params.keep_endpoint and ti.xcom_pull(task_ids='smoke_test') is not none }}"
IDLE_WATCH_TASK_ID = "serve_until_idle"
_VERDICT = "ti.xcom_pull(task_ids='" + IDLE_WATCH_TASK_ID + "')"
ENDPOINT_VERDICT = "{{ " + _VERDICT + " }}"
# The teardowns keep what the watch says to keep; a watch that failed or never ran says nothing: torn down.
KEEP_AFTER_WATCH = "{{ (" + _VERDICT + " or {}).get('keep', False) }}"


def wants_endpoint(workload: Workload) -> str | bool:
    """Whether the run asks to keep its endpoint: KEEP_ENDPOINT; without a smoke test, when the deploy
    succeeded; without serving, never."""
    if workload.serve_app is None:
        return False
    if workload.smoke_request is None:
        return "{{ params.keep_endpoint and ti.xcom_pull(task_ids='deploy') is not none }}"
    return KEEP_ENDPOINT


def keep_endpoint(workload: Workload) -> str | bool:
    """The teardowns' ``keep``: the idle watch's verdict (serve_until_idle_task); without serving, never."""
    return KEEP_AFTER_WATCH if workload.serve_app is not None else False


def serving_expires_after(workload: Workload) -> str | timedelta:
    """``expires_after`` of what serves the endpoint: none when the run keeps it (every kept endpoint is watched: its
    ``idle_timeout`` is held at the admin's ceiling, tpuflow.limits).

    Its watch (serve_until_idle_task) vouches for it while it serves, and the run is running meanwhile: with no
    expiry the orphan reaper judges it by its run alone, so an endpoint still serving at the expiry's 24 h is
    not taken, and once the run ends, however it ends, the teardowns or the reaper remove it."""
    if workload.serve_app is None:
        return DEFAULT_EXPIRES_AFTER
    default = int(DEFAULT_EXPIRES_AFTER.total_seconds())
    return "{{ None if params.keep_endpoint else " + f"{default} }}}}"


def serve_until_idle_task(workload: Workload, cluster: str) -> BaseOperator:
    """The task that says whether the teardowns keep the endpoint, and while kept waits in the triggerer until it
    has served no request for the ``idle_timeout`` Param's minutes, held at the admin's ceiling (empty or 0: the
    ceiling; tpuflow.limits), tpuflow.serve.idle_stop.

    ``cluster``: the XCom where the endpoint's metrics are read (``metrics_url``)."""
    return RayServeWaitForIdleOperator(
        task_id=IDLE_WATCH_TASK_ID,
        cluster=cluster,
        keep=wants_endpoint(workload),
        idle_timeout_minutes="{{ tpuflow_limits.idle_timeout(params.idle_timeout) }}",
    )


class Admission(NamedTuple):
    """How a run gets its slice, the same on every backend: the budget guard, an approver's answer when the
    estimate is over budget, the slice lease; and the lease given back (a teardown)."""

    guard: BaseOperator
    approve: BaseOperator
    lease: BaseOperator
    release: BaseOperator


def admission_steps(
    checked: BaseOperator,
    *,
    dag_id: str,
    output_root: str | None,
    run_dir: str,
    budget_slices: list[dict[str, Any]],
    lease_root: str | None = None,
    gcp_conn_id: str = "google_cloud_default",
) -> Admission:
    """check_params >> budget_guard >> approve_budget >> acquire_slice, and release_slice as the lease's
    teardown: a run over its budget may wait for a person, and holds no slice lease while it waits.

    ``budget_slices``: the guard's ``slices`` (what the run will hold); ``lease_root`` and ``gcp_conn_id``:
    where the leases and the run's records are (default: the local lease root, the default connection)."""
    guard = TPUCheckChipBudgetOperator(
        task_id="budget_guard",
        max_chip_hours="{{ params.max_chip_hours }}",
        slices=budget_slices,
        over_budget="{{ params.over_budget }}",
        ledger_dir=dag_dir_for(dag_id, output_root),
        gcp_conn_id=gcp_conn_id,
    )
    approve = ChipBudgetApprovalOperator(task_id="approve_budget", record_dir=run_dir, gcp_conn_id=gcp_conn_id)
    lease = TPUAcquireSliceOperator(
        task_id="acquire_slice",
        max_slices=MAX_SLICES,
        tpu_slice=checked_slice(),
        lease_root=lease_root,
        gcp_conn_id=gcp_conn_id,
    )
    release = TPUReleaseSliceOperator(task_id="release_slice", lease_root=lease_root, gcp_conn_id=gcp_conn_id)
    checked >> guard >> approve >> lease
    release.as_teardown(setups=[checked, lease])
    return Admission(guard, approve, lease, release)


def build_pipeline_dag(
    dag_id: str,
    *,
    workload: Workload,
    schedule: str | None = "@daily",
    output_root: str | None = None,
    start_date: datetime = START_DATE,
    max_active_runs: int = 1,
    serve_token_conn_id: str | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """The embedded default: a local Ray cluster simulating the slice stands in for GKE + KubeRay.

    ``serve_token_conn_id``: an Airflow Connection whose password is the endpoint's bearer token (the app
    requires it, the smoke test sends it); None: the endpoint answers without one.

    ``workload``: the steps to run (tpuflow.pipeline.workload.Workload); each step it lacks has no task."""
    # The local backend's own operators: imported here, so the GKE DAG file (which shares this module's
    # steps) does not load them when it is parsed.
    from tpuflow.cost.local import LocalStopRecordingSpanOperator, LocalWriteChipLedgerOperator
    from tpuflow.local.operators import LocalRayCreateClusterOperator

    run_dir = run_dir_for(dag_id, output_root)
    with pipeline_dag(
        dag_id,
        schedule=schedule,
        start_date=start_date,
        max_active_runs=max_active_runs,
        workload=workload,
        **dag_kwargs,
    ) as dag:
        checked = CheckParamsOperator(task_id="check_params", output_dir=run_dir, workload=workload)
        admission = admission_steps(
            checked,
            dag_id=dag_id,
            output_root=output_root,
            run_dir=run_dir,
            budget_slices=[{"role": "train", "tpu": TRAIN_SLICE, "steps": "{{ params.train_steps }}"}],
        )
        start = LocalRayCreateClusterOperator(
            task_id="start_cluster",
            tpu_slice=checked_slice(),
            expires_after=serving_expires_after(workload),  # the endpoint is served from the training slice
            retries=0,
            pre_execute=BudgetGate(record_dir=run_dir),  # over budget: only once an approver's answer is recorded
        )
        cluster = start.output
        prep, train, evaluate = training_steps(cluster, run_dir, workload=workload)
        deploy = None
        if workload.serve_app:
            serve_cfg = build_serve_config(
                cluster,
                train.output,
                f"local://{workloads_dir()}",
                tpu_slice=SERVE_SLICE,
                workload=workload,
                code_uri=workload.local_code_uri(),
            )
            # The replicas serve from the training slice's simulated hosts (tpuflow.pipeline.params.local_serve_slice).
            deploy = RayServeDeployOperator(
                task_id="deploy",
                cluster=cluster,
                serve_config=serve_cfg,
                tpu_slice=SERVE_SLICE,
                serve_token_conn_id=serve_token_conn_id,
            )
            (evaluate or train) >> serve_cfg >> deploy
        _, report = smoke_test_and_report(
            run_dir, evaluate, deploy, workload=workload, train=train, serve_token_conn_id=serve_token_conn_id
        )
        # Not start.output: a start task that failed after its cluster came up pushed no XCom, and the
        # teardown must still find that cluster (by its deterministic name when the pull is empty).
        stop = LocalStopRecordingSpanOperator(
            task_id="stop_cluster",
            cluster="{{ ti.xcom_pull(task_ids='start_cluster') }}",
            keep=keep_endpoint(workload),
        )
        watch = serve_until_idle_task(workload, "{{ ti.xcom_pull(task_ids='start_cluster') }}") if deploy else None
        # everything runs on the one simulated slice (the ledger's timeline)
        slice_work = {
            task.task_id: cause
            for task, cause in ((prep, DATA_PREP), (train, TRAINING), (evaluate, EVALUATION), (deploy, SERVING))
            if task is not None
        }
        slice_work["preflight"] = PREFLIGHT
        ledger = LocalWriteChipLedgerOperator(
            task_id=LEDGER_TASK_ID,
            slices=[
                {
                    "role": "train",
                    "tpu": TRAIN_SLICE,
                    "task_id": "stop_cluster",
                    "work": slice_work,
                    "cluster_task_id": "start_cluster",  # a team's own Ray jobs on it are work too
                }
            ],
            trained="{{ ti.xcom_pull(task_ids='train') }}",
            output_dir=run_dir,
            prices="{{ var.value.get('" + PRICES_VARIABLE + "', '') }}",
            endpoint=ENDPOINT_VERDICT if watch else None,
        )
        admission.lease >> start
        if prep:
            start >> prep
        if watch:
            report >> watch
        (watch or report) >> stop >> [admission.release, ledger]
        # check_params is a setup of each teardown too, as in the GKE DAG: a teardown runs when one of its
        # setups succeeded, and a start (or lease) task that failed after its work still left something.
        stop.as_teardown(setups=[checked, start])
        ledger.as_teardown(setups=[checked, start])
    return dag
