"""Submit a Ray job and wait for it, deferrably; re-attach instead of resubmitting on retries."""

from __future__ import annotations

import asyncio
import math
import shlex
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, BaseOperatorLink
from airflow.sdk.exceptions import AirflowFailException

from tpuflow import workloads_dir
from tpuflow.arguments import RUN_TIME, ArgumentCheck, ArgumentChecks
from tpuflow.errors import UserInputError
from tpuflow.events import raise_for_event
from tpuflow.naming import TaskIdentity
from tpuflow.output_links import OutputsLink, browse_url
from tpuflow.ray.cluster_source import cluster_source_task, trusted_cluster
from tpuflow.ray.connection import check_cluster
from tpuflow.ray.links import RayDashboardLink, RayJobLink, RayJobLogLink
from tpuflow.rayjob import UNREACHABLE_TIMEOUT_S
from tpuflow.storage import emulator_env, write_text
from tpuflow.validation import check_number, check_seconds
from tpuflow.work_spans import WORK_SPAN_KEY, job_work_span

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.rayjob.hooks import RayJobHook

# Key of the task state store entry naming the task's current Ray job (Airflow 3.3 durable
# execution). Renaming it breaks re-attachment for retries already in flight.
SUBMISSION_STATE_KEY = "ray_submission_id"
_ENTRYPOINT_FIX = (
    'give the command the job driver runs as an argument list, e.g. ["python", "-m", "my_package.job", "--out", path], '
    "or a shell command string"
)


def command_line(entrypoint: Sequence[Any] | str, python: str | None = None) -> str:
    """The shell command Ray runs (its job manager starts every entrypoint with a shell).

    An argument list is quoted item by item with ``shlex.join``: a path holding a space, a quote or
    ``$(...)`` reaches the program as one argument and is never run. A string is the user's own shell
    command, run as written. ``python``: the interpreter that replaces a leading ``python`` (quoted too).
    """
    if isinstance(entrypoint, str):
        if python and entrypoint.startswith("python "):
            return f"{shlex.quote(python)} {entrypoint[len('python ') :]}"
        return entrypoint
    argv = [str(item) for item in entrypoint]
    if python and argv and argv[0] == "python":
        argv[0] = python
    return shlex.join(argv)


def _check_entrypoint(value: Any) -> None:
    """A non-empty command string, or a non-empty list of plain values (each one argument); None: unset."""
    if value is None:
        return
    if isinstance(value, str):
        if not value.strip():
            raise UserInputError("entrypoint", value, _ENTRYPOINT_FIX)
        return
    if not isinstance(value, list | tuple) or not value:
        raise UserInputError("entrypoint", value, _ENTRYPOINT_FIX)
    for index, item in enumerate(value):
        if not isinstance(item, str | int | float) or isinstance(item, bool):
            raise UserInputError(f"entrypoint[{index}]", item, "give each argument as a string or a number")


class QualityGateError(AirflowFailException):
    """The job succeeded but its result is below the gate: retrying would not help."""


def _check_mapping(field: str, value: Any) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise UserInputError(field, value, "give a dict (or leave it unset)")


def _check_text(field: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise UserInputError(field, value, "give a string (or leave it unset)")


def _check_min_result(value: Any) -> None:
    """Each quality-gate minimum is a finite number."""
    for key, minimum in (value or {}).items():
        try:
            float(minimum)
        except (TypeError, ValueError):
            raise UserInputError(f"min_result[{key}]", minimum, "give the lowest acceptable number") from None
        if not math.isfinite(float(minimum)):
            raise UserInputError(f"min_result[{key}]", minimum, "give the lowest acceptable (finite) number")


def _check_cpus(value: Any) -> None:
    if value is not None:
        check_number("entrypoint_num_cpus", value, minimum=0)


class RaySubmitJobOperator(ArgumentChecks, BaseOperator):
    """Run ``entrypoint`` as a Ray job on a cluster and return its result (the last TPUFLOW_RESULT line).

    The submission id derives from (dag id, run id, task id, map index), never the try number:
    a retry re-attaches to the running job, returns the result of a job that already succeeded,
    and resubmits (as ``<id>-rN``) only a job that failed or was stopped. The current job is also
    recorded in the task state store (``ray_submission_id``). A job that fails in the user's code
    (a traceback, no sign of lost infrastructure) fails the task without retries.

    Killing the task stops its job, while it waits in the worker (``on_kill``) and while it is
    deferred (the trigger's ``on_kill``).

    A subclass adds its checks to ``argument_checks()``; they run at parse time once its own ``__init__``
    has set its attributes (``tpuflow.arguments``).

    :param entrypoint: what the job driver runs on the head node: an argument list
        (``["python", "-m", "pkg.job", "--out", path]``; each item is templated, then the list is quoted with
        ``shlex.join``, so no value reaches the shell unquoted), or a shell command string, run as written
        (quote values yourself); templated.
    :param cluster: connection info pushed by a cluster-start task (dashboard_url, ...); templated.
    :param ray_conn_id: Airflow connection (type ``ray``) naming the dashboard, when ``cluster`` is not given.
    :param working_dir: folder shipped as the job's runtime_env working_dir, the driver's current
        directory (default None: the workloads shipped with tpuflow, wherever it is installed; "" for
        none); a local folder or archive, or a remote URI. With any other than the default, tpuflow's
        own ``tpuflow_driver`` travels beside it as a ``py_modules`` entry; templated.
    :param runtime_env: extra runtime_env keys (pip, py_modules: package folders holding __init__.py,
        .whl files or URIs, ...); templated. A local working_dir or py_modules entry Ray could not ship
        (missing, a single .py file, not a package, over the dashboard's upload limit) fails the task
        before submitting, without retries.
    :param env_vars: environment variables for the driver and the job's workers; templated.
    :param entrypoint_num_cpus: CPUs reserved for the driver (Ray's ``entrypoint_num_cpus``).
    :param entrypoint_resources: custom resources reserved for the driver (Ray's ``entrypoint_resources``).
    :param submission_id: the job's submission id; default: derived from the task instance; templated.
    :param deferrable: wait in the triggerer (default) instead of the worker.
    :param poll_interval: seconds between status polls.
    :param job_timeout: seconds after which the job is stopped and the task fails (retried); None: no limit.
    :param unreachable_timeout: seconds the Ray dashboard may not answer in a row before the wait fails, retryable
        (the head is gone, or was replaced and answers at a new address: the retry reaches it there, re-attaches
        to the job or submits it again); None: wait on until ``job_timeout``.
    :param min_result: quality gate, e.g. {"accuracy": 0.9}: fail (without retry) if the result is below; a key
        missing from the result's top level is looked up in its ``metrics`` (a Ray Train run's); templated.
    :param log_uri: where to keep the job's full driver log once it ends, whatever the outcome (local path
        or gs://); templated.
    :param train_run_path: the Ray Train run folder the job writes (RunConfig storage_path/name, local path or
        gs://); once the job succeeds, its latest checkpoint and the metrics reported with it come from Ray
        Train's own record (``Result.from_path``): the result gains ``checkpoint``, ``metrics`` and
        ``train_run_path``, under whatever the job's own result line says (its keys win). A folder with no
        Ray Train record of a checkpoint fails the task without retries; templated.
    """

    template_fields: Sequence[str] = (
        "entrypoint",
        "cluster",
        "runtime_env",
        "env_vars",
        "working_dir",
        "submission_id",
        "min_result",
        "log_uri",
        "train_run_path",
    )
    template_fields_renderers = {"runtime_env": "json", "env_vars": "json", "cluster": "json"}
    operator_extra_links: tuple[BaseOperatorLink, ...] = (RayJobLink(), RayDashboardLink(), RayJobLogLink())
    ui_color = "#c7e8ff"
    # what the job's time on the slice counts as in the ledger's timeline (tpuflow.work_spans)
    work_cause = "job"

    def __init__(
        self,
        *,
        entrypoint: str | list[Any] | None = None,
        cluster: dict[str, Any] | str | None = None,
        ray_conn_id: str | None = None,
        working_dir: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        env_vars: dict[str, str] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        submission_id: str | None = None,
        deferrable: bool = True,
        poll_interval: float = 2.0,
        job_timeout: float | None = None,
        unreachable_timeout: float | None = UNREACHABLE_TIMEOUT_S,
        min_result: Mapping[str, float | str] | None = None,
        log_uri: str | None = None,
        train_run_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.entrypoint = entrypoint
        self.cluster = cluster
        self._cluster_source = cluster_source_task(cluster)  # whose XCom it is: where and how come from that task
        self.ray_conn_id = ray_conn_id
        self.working_dir = working_dir
        self.runtime_env = runtime_env
        self.env_vars = env_vars
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.entrypoint_resources = entrypoint_resources
        self.submission_id = submission_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.job_timeout = job_timeout
        self.unreachable_timeout = unreachable_timeout
        self.min_result = min_result
        self.log_uri = log_uri
        self.train_run_path = train_run_path
        # What on_kill stops: the job this task submitted or re-attached to, while the worker follows it.
        self._owned: str | None = None

    # --- arguments ---------------------------------------------------------------
    def argument_checks(self) -> list[ArgumentCheck]:
        """The job's arguments, checked at parse time when static and once rendered at the start of execute
        (before anything is submitted); subclasses add theirs."""
        return [
            *super().argument_checks(),
            ((self.entrypoint,), lambda: _check_entrypoint(self.entrypoint)),
            ((self.cluster,), lambda: check_cluster(self.cluster, self.ray_conn_id)),
            *(
                ((getattr(self, field),), partial(_check_mapping, field, getattr(self, field)))
                for field in ("runtime_env", "env_vars", "min_result")
            ),
            *(
                ((getattr(self, field),), partial(_check_text, field, getattr(self, field)))
                for field in ("working_dir", "submission_id", "log_uri", "train_run_path")
            ),
            ((self.min_result,), lambda: _check_min_result(self.min_result)),
            # Never templated: checked at parse time whatever the others are.
            ((), lambda: check_seconds("poll_interval", self.poll_interval)),
            ((), lambda: check_seconds("job_timeout", self.job_timeout, optional=True)),
            ((), lambda: check_seconds("unreachable_timeout", self.unreachable_timeout, optional=True)),
            ((), lambda: _check_cpus(self.entrypoint_num_cpus)),
            ((RUN_TIME,), self._check_code_shipping),
        ]

    def _check_code_shipping(self) -> None:
        """The code Ray would upload with the job: a mistake there fails the task now, without retries."""
        from tpuflow.rayjob.code_shipping import check_code_shipping

        field = "runtime_env['working_dir']" if "working_dir" in (self.runtime_env or {}) else "working_dir"
        check_code_shipping(
            self.build_runtime_env(),
            working_dir_field=field,
            # check_code_shipping (rayjob/code_shipping.py) types logger as logging.Logger; Airflow's structlog
            # logger has the calls Ray's upload helpers make (info/debug/warning)
            logger=self.log,  # type: ignore[arg-type]
        )

    # --- helpers -----------------------------------------------------------------
    def _cluster_info(self) -> dict[str, Any]:
        return self.cluster if isinstance(self.cluster, dict) else {}

    def hook(self) -> RayJobHook:
        from tpuflow.rayjob.hooks import RayJobHook

        return RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self._cluster_info())

    def build_entrypoint(self, context: Context) -> list[Any] | str:
        """The command the job driver runs: an argument list (subclasses build one from their own
        arguments) or the user's shell command string."""
        if not self.entrypoint:
            raise UserInputError("entrypoint", self.entrypoint, _ENTRYPOINT_FIX)
        return self.entrypoint

    def build_runtime_env(self) -> dict[str, Any]:
        """The job's runtime_env: the user's keys, the working_dir, and tpuflow's driver beside the code.

        Environment values travel here (``env_vars``), never on the job's command line: the entrypoint is
        logged and shown as the job's name in Ray's dashboard. Sensitive ones are masked in the task log by
        whichever process follows the job (``tpuflow.rayjob.secret_env``)."""
        from tpuflow.rayjob.code_shipping import with_driver

        env = dict(self.runtime_env or {})
        working_dir = workloads_dir() if self.working_dir is None else self.working_dir
        if working_dir and "working_dir" not in env:
            env["working_dir"] = working_dir
        env = with_driver(env)
        if self.env_vars:
            env["env_vars"] = {**env.get("env_vars", {}), **{k: str(v) for k, v in self.env_vars.items()}}

        if emulator_env():  # gs:// on this side means the emulator: the driver and workers must agree
            env["env_vars"] = {**emulator_env(), **env.get("env_vars", {})}
        return env

    def before_submit(self, context: Context) -> None:
        """Called once right before a new job is submitted (never when a try re-attaches to its running or
        finished job): what a subclass prepares for a fresh run."""

    def output_uri(self) -> str | None:
        """Where the job writes its outputs (the Outputs link); None: not known."""
        return None

    def base_submission_id(self, context: Context) -> str:
        return self.submission_id or TaskIdentity.from_context(context).submission_id

    # --- execution ---------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        self.validate_arguments()
        self.cluster = trusted_cluster(self, self.cluster, self._cluster_source, context)
        return self._execute_checked(context)

    def _execute_checked(self, context: Context) -> Any:
        """``execute`` once the arguments are checked: the Outputs link, then the job."""
        OutputsLink.persist(context, uri=self.output_uri())
        return self._submit_and_follow(context, may_restart=True)

    def _submit_and_follow(self, context: Context, *, may_restart: bool) -> Any:
        """Attach to (or submit) the task's job, then follow it in the triggerer or in this worker."""
        hook = self.hook()
        RayDashboardLink.persist(context, url=hook.dashboard_url)
        sid, status, reattached, nonce = self._attach_or_submit(hook, self.base_submission_id(context), context)
        self._owned = sid
        RayJobLink.persist(context, dashboard_url=hook.dashboard_url, submission_id=sid)
        # A cleared task's new try can find its old job still RUNNING while the previous try's kill
        # is stopping it (the scheduler does not wait for the triggerer's on_kill). If a job this try
        # re-attached to ends STOPPED, it starts a fresh one instead of failing -- once.
        wait = {
            "submission_id": sid,
            "poll_interval": self.poll_interval,
            "timeout": self.job_timeout,
            "unreachable_timeout": self.unreachable_timeout,
            "restart_if_stopped": reattached and may_restart,
            "result_nonce": nonce,
        }
        if status == "SUCCEEDED":
            self.log.info("Ray job %s already succeeded in an earlier try; not running it again", sid)
        elif self.deferrable:
            self.execute_async(context, wait)
        return self.execute_sync(context, wait)

    def execute_async(self, context: Context, wait: dict[str, Any]) -> None:
        """Defer: RayJobTrigger follows the job (and streams its log) in the triggerer."""
        from tpuflow.rayjob.triggers import RayJobTrigger

        self.defer(
            trigger=RayJobTrigger(
                cluster=self._cluster_info(), ray_conn_id=self.ray_conn_id, end_task=self.task_end(), **wait
            ),
            method_name="execute_complete",
        )

    def execute_sync(self, context: Context, wait: dict[str, Any]) -> Any:
        """Follow the job from this worker: the trigger's own wait, run here."""
        from tpuflow.rayjob.waits import wait_for_job

        event = asyncio.run(wait_for_job(self.hook(), started_at=time.time(), log=self.log, **wait))
        return self.execute_complete(context, dict(event))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """The job's outcome, for both paths: the trigger's event, or the same event from execute_sync."""
        try:
            raise_for_event(event, f"Ray job {event.get('submission_id') if isinstance(event, Mapping) else ''}")
        finally:
            self._owned = None
            self._keep_log(context, event)  # whatever the outcome
            self._record_work_span(context, event)
        if event["job_status"] == "STOPPED":  # a restart_if_stopped wait: the re-attached job was stopped
            self.log.warning("%s: %s", event["submission_id"], event["message"])
            return self._submit_and_follow(context, may_restart=False)
        return self._check_result(self._with_train_result(event.get("result") or {}))

    def _attach_or_submit(self, hook: RayJobHook, base_id: str, context: Context) -> tuple[str, str, bool, str | None]:
        """The job this task already runs (named in the task state store, else found by its
        deterministic id on the cluster), or a new submission; either way recorded in the store.
        Returns (submission id, status, whether it re-attached to an existing job, the job's result nonce).

        A new job gets a fresh result nonce in its metadata, which Ray hands to the job's driver alone
        (``tpuflow_driver.result``); a re-attached job's comes from its metadata (None: submitted without).

        Like KubernetesPodOperator, durable execution is built in rather than taken from
        ResumableJobMixin: the mixin only covers a blocking wait, and this operator defers.
        """
        from tpuflow.rayjob.hooks import RESULT_NONCE_KEY, job_result_nonce, new_result_nonce

        store = context.get("task_state_store")
        jobs = hook.find_jobs(base_id)
        stored = store.get(SUBMISSION_STATE_KEY) if store is not None else None
        by_id = {job.submission_id: job for job in jobs}
        if isinstance(stored, str) and stored not in by_id and stored.startswith(base_id):
            self.log.warning("Ray job %s recorded by an earlier try is not on this cluster; looking for others", stored)
        latest = by_id[stored] if isinstance(stored, str) and stored in by_id else (jobs[-1] if jobs else None)
        if latest is not None:
            status = str(latest.status.value if hasattr(latest.status, "value") else latest.status)
            if status in ("PENDING", "RUNNING", "SUCCEEDED"):
                self.log.info("Re-attaching to Ray job %s (%s)", latest.submission_id, status)
                self._record_submission(store, str(latest.submission_id))
                return str(latest.submission_id), status, True, job_result_nonce(latest)
            sid = f"{base_id}-r{len(jobs)}"
            self.log.info("Earlier job %s ended %s; resubmitting as %s", latest.submission_id, status, sid)
        else:
            sid = base_id
        # A local cluster's nodes run the environment that started them; PATH on a shared machine may
        # name another Python first, so a leading `python` becomes it. (KubeRay images have one `python`.)
        entrypoint = command_line(self.build_entrypoint(context), self._cluster_info().get("python"))
        self.before_submit(context)
        self.log.info("Submitting Ray job %s: %s", sid, entrypoint)
        nonce = new_result_nonce()
        hook.submit_job(
            entrypoint=entrypoint,
            submission_id=sid,
            runtime_env=self.build_runtime_env(),
            entrypoint_num_cpus=self.entrypoint_num_cpus,
            entrypoint_resources=self.entrypoint_resources,
            metadata={"airflow_task": self.task_id, "airflow_dag": self.dag_id, RESULT_NONCE_KEY: nonce},
        )
        self._record_submission(store, sid)
        return sid, "PENDING", False, nonce

    @staticmethod
    def _record_submission(store: Any, sid: str) -> None:
        if store is not None:
            store.set(SUBMISSION_STATE_KEY, sid)

    def _record_work_span(self, context: Context, event: Any) -> None:
        """The job's time on its cluster, for the ledger's timeline (XCom ``work_span``), whatever the outcome."""
        span = job_work_span(self.work_cause, event, event.get("submission_id")) if isinstance(event, Mapping) else None
        if span is not None:
            context["ti"].xcom_push(key=WORK_SPAN_KEY, value=span)

    def _keep_log(self, context: Context, event: Any) -> None:
        """Keep the job's full driver log at log_uri (best effort: never masks the job's outcome)."""
        sid = event.get("submission_id") if isinstance(event, Mapping) else None
        if not self.log_uri or not sid:
            return
        try:
            write_text(self.log_uri, self.hook().get_job_logs(sid))
            RayJobLogLink.persist(context, url=browse_url(self.log_uri))
            self.log.info("Full driver log of %s kept at %s", sid, self.log_uri)
        except Exception as err:
            self.log.warning("Could not keep the driver log at %s: %s", self.log_uri, err)

    def _with_train_result(self, result: dict[str, Any]) -> dict[str, Any]:
        """The job's result over its Ray Train run's record (train_run_path), the job's own keys winning."""
        if not self.train_run_path:
            return result
        from tpuflow.rayjob.train_result import read_train_result

        recorded = read_train_result(self.train_run_path)
        self.log.info("Ray Train run %s: latest checkpoint %s", self.train_run_path, recorded["checkpoint"])
        return {**recorded, **result}

    def _check_result(self, result: dict[str, Any]) -> dict[str, Any]:
        from tpuflow.rayjob.quality_gate import gate_failure

        failure = gate_failure(result, self.min_result)
        if failure:
            raise QualityGateError(failure)
        return result

    def task_end(self) -> dict[str, Any] | None:
        """What RayJobTrigger needs to end this task itself when the job succeeds (no worker process
        resumes it): the quality gate and whether the result is the return value. None where the success
        has work of its own on the worker: keeping the driver log (``log_uri``) or reading the Ray Train
        run's record (``train_run_path``); a subclass with more success work returns None too."""
        from tpuflow.triggers import may_end_in_triggerer

        if self.log_uri or self.train_run_path or not may_end_in_triggerer(self):
            return None
        return {
            "min_result": dict(self.min_result or {}),
            "return_result": bool(self.do_xcom_push),
            "work_cause": self.work_cause,
        }

    def on_kill(self) -> None:
        """Killed while the worker follows the job (not deferred): stop the job."""
        if self._owned:
            self.log.info("Task killed: stopping Ray job %s", self._owned)
            self.hook().stop_job(self._owned)
