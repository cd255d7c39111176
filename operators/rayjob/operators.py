"""Submit a Ray job and wait for it, deferrably; re-attach instead of resubmitting on retries."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from tpuflow import workloads_dir
from tpuflow.errors import UserInputError
from tpuflow.naming import submission_id as derive_submission_id
from tpuflow.rayjob.links import RayDashboardLink, RayJobLink, RayJobLogLink

if TYPE_CHECKING:
    from airflow.sdk import Context
    from tpuflow.rayjob.hooks import RayJobHook

# Key of the task state store entry naming the task's current Ray job (Airflow 3.3 durable
# execution). Renaming it breaks re-attachment for retries already in flight.
SUBMISSION_STATE_KEY = "ray_submission_id"


class RayJobFailedError(RuntimeError):
    """The Ray job ended FAILED, STOPPED or past its deadline."""


class UserCodeError(AirflowFailException):
    """The job failed in the user's code: a retry would fail the same way, so the task fails at once."""


class QualityGateError(AirflowFailException):
    """The job succeeded but its result is below the gate: retrying would not help."""


class RaySubmitJobOperator(BaseOperator):
    """Run `entrypoint` as a Ray job on a cluster and return its result (the last TPUFLOW_RESULT line).

    The submission id derives from (dag id, run id, task id, map index), never the try number:
    a retry re-attaches to the running job, returns the result of a job that already succeeded,
    and resubmits (as `<id>-rN`) only a job that failed or was stopped.

    :param entrypoint: shell command run by the job driver on the head node.
    :param cluster: connection info pushed by a cluster-start task (dashboard_url, ...); templated.
    :param ray_conn_id: Airflow connection naming the dashboard, when `cluster` is not given.
    :param working_dir: folder shipped as the job's runtime_env working_dir (default None: the workloads shipped
        with tpuflow, wherever it is installed; "" for none).
    :param runtime_env: extra runtime_env keys (pip, py_modules, ...).
    :param env_vars: environment variables for the driver and the job's workers.
    :param min_result: quality gate, e.g. {"accuracy": 0.9}: fail if the result is below.
    :param log_uri: where to keep the job's full driver log once it ends (local path or gs://).
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
    )
    template_fields_renderers = {"runtime_env": "json", "env_vars": "json", "cluster": "json"}
    operator_extra_links = (RayJobLink(), RayDashboardLink(), RayJobLogLink())
    ui_color = "#c7e8ff"

    def __init__(
        self,
        *,
        entrypoint: str,
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
        min_result: dict[str, float] | None = None,
        log_uri: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.entrypoint = entrypoint
        self.cluster = cluster
        self.ray_conn_id = ray_conn_id
        self.working_dir = working_dir
        self.runtime_env = runtime_env or {}
        self.env_vars = env_vars or {}
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.entrypoint_resources = entrypoint_resources
        self.submission_id = submission_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.job_timeout = job_timeout
        self.min_result = min_result or {}
        self.log_uri = log_uri
        self._active_submission_id: str | None = None

    # --- helpers -----------------------------------------------------------------
    def _cluster_info(self) -> dict[str, Any]:
        if isinstance(self.cluster, dict):
            return self.cluster
        if self.cluster in (None, ""):
            return {}
        raise UserInputError(
            "cluster",
            self.cluster,
            "pass the cluster-start task's XCom (a dict), e.g. "
            "\"{{ ti.xcom_pull(task_ids='start_cluster') }}\" with render_template_as_native_obj",
        )

    def hook(self) -> RayJobHook:
        from tpuflow.rayjob.hooks import RayJobHook

        return RayJobHook(ray_conn_id=self.ray_conn_id, cluster=self._cluster_info())

    def build_runtime_env(self) -> dict[str, Any]:
        env = dict(self.runtime_env)
        working_dir = workloads_dir() if self.working_dir is None else self.working_dir
        if working_dir and "working_dir" not in env:
            if "://" not in working_dir and not Path(working_dir).is_dir():
                raise UserInputError("working_dir", working_dir, "give an existing folder or a remote URI")
            env["working_dir"] = working_dir
        if self.env_vars:
            env["env_vars"] = {**env.get("env_vars", {}), **{k: str(v) for k, v in self.env_vars.items()}}
        from tpuflow.storage import emulator_env

        if emulator_env():  # gs:// on this side means the emulator: the driver and workers must agree
            env["env_vars"] = {**emulator_env(), **env.get("env_vars", {})}
        return env

    def base_submission_id(self, context: Context) -> str:
        if self.submission_id:
            return self.submission_id
        ti = context["ti"]
        return derive_submission_id(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))

    # --- execution ---------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        hook = self.hook()
        RayDashboardLink.persist(context, url=hook.dashboard_url)
        return self._run(context, hook, may_restart=True)

    def _run(self, context: Context, hook: RayJobHook, may_restart: bool) -> Any:
        sid, status, reattached = self._attach_or_submit(hook, self.base_submission_id(context), context)
        self._active_submission_id = sid
        RayJobLink.persist(context, dashboard_url=hook.dashboard_url, submission_id=sid)
        if status == "SUCCEEDED":
            self.log.info("Ray job %s already succeeded in an earlier try; not running it again", sid)
            from tpuflow.rayjob.hooks import parse_result

            return self._check_result(parse_result(self._keep_log(context, hook, sid)))
        # A cleared task's new try can find its old job still RUNNING while the previous try's kill
        # is stopping it (the scheduler does not wait for the triggerer's on_kill). If a job this try
        # re-attached to ends STOPPED, it starts a fresh one instead of failing -- once.
        restart_if_stopped = reattached and may_restart
        if self.deferrable:
            from tpuflow.rayjob.triggers import RayJobTrigger

            self.defer(
                trigger=RayJobTrigger(
                    submission_id=sid,
                    cluster=self._cluster_info(),
                    ray_conn_id=self.ray_conn_id,
                    poll_interval=self.poll_interval,
                    timeout=self.job_timeout,
                    restart_if_stopped=restart_if_stopped,
                ),
                method_name="execute_complete",
            )
        event = self._wait_blocking(hook, sid)
        return self.execute_complete(context, {**event, "restart_if_stopped": restart_if_stopped})

    def _attach_or_submit(self, hook: RayJobHook, base_id: str, context: Context) -> tuple[str, str, bool]:
        """The job this task already runs (named in the task state store, else found by its
        deterministic id on the cluster), or a new submission; either way recorded in the store.
        Returns (submission id, status, whether it re-attached to an existing job).

        Like KubernetesPodOperator, durable execution is built in rather than taken from
        ResumableJobMixin: the mixin only covers a blocking wait, and this operator defers.
        """
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
                self._record_submission(store, latest.submission_id)
                return latest.submission_id, status, True
            sid = f"{base_id}-r{len(jobs)}"
            self.log.info("Earlier job %s ended %s; resubmitting as %s", latest.submission_id, status, sid)
        else:
            sid = base_id
        runtime_env = self.build_runtime_env()
        entrypoint = self.entrypoint
        python = self._cluster_info().get("python")
        if python and entrypoint.startswith("python "):
            # A local cluster's nodes run the environment that started them; PATH on a shared
            # machine may name another Python first. (KubeRay images have one `python`.)
            entrypoint = f"{python} {entrypoint[len('python '):]}"
        self.log.info("Submitting Ray job %s: %s", sid, entrypoint)
        hook.submit_job(
            entrypoint=entrypoint,
            submission_id=sid,
            runtime_env=runtime_env,
            entrypoint_num_cpus=self.entrypoint_num_cpus,
            entrypoint_resources=self.entrypoint_resources,
            metadata={"airflow_task": self.task_id, "airflow_dag": self.dag_id},
        )
        self._record_submission(store, sid)
        return sid, "PENDING", False

    @staticmethod
    def _record_submission(store: Any, sid: str) -> None:
        if store is not None:
            store.set(SUBMISSION_STATE_KEY, sid)

    def _wait_blocking(self, hook: RayJobHook, sid: str) -> dict[str, Any]:
        from tpuflow.rayjob.hooks import TERMINAL_JOB_STATES, log_tail, parse_result, strip_ansi

        offset, started = 0, time.time()
        while True:
            status = hook.get_job_status(sid)
            logs = hook.get_job_logs(sid)
            for line in strip_ansi(logs[offset:]).rstrip("\n").splitlines():
                self.log.info("[ray job] %s", line)
            offset = max(offset, len(logs))
            if status in TERMINAL_JOB_STATES:
                info = hook.get_client().get_job_info(sid)
                return {
                    "status": status,
                    "submission_id": sid,
                    "message": info.message or "",
                    "log_tail": log_tail(logs),
                    "result": parse_result(logs),
                }
            if self.job_timeout is not None and time.time() - started > self.job_timeout:
                hook.stop_job(sid)
                return {
                    "status": "TIMEOUT",
                    "submission_id": sid,
                    "log_tail": log_tail(logs),
                    "message": f"job exceeded {self.job_timeout:.0f}s and was stopped",
                    "result": {},
                }
            time.sleep(self.poll_interval)

    def _keep_log(self, context: Context, hook: RayJobHook, sid: str) -> str:
        logs = hook.get_job_logs(sid)
        if self.log_uri:
            from tpuflow.storage import browse_url, write_text

            write_text(self.log_uri, logs)
            RayJobLogLink.persist(context, url=browse_url(self.log_uri))
            self.log.info("Full driver log of %s kept at %s", sid, self.log_uri)
        return logs

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        self._active_submission_id = None
        status = event.get("status")
        if self.log_uri and event.get("submission_id"):
            try:
                self._keep_log(context, self.hook(), event["submission_id"])
            except Exception as err:  # keeping the log must not mask the job's own outcome
                self.log.warning("Could not keep the driver log at %s: %s", self.log_uri, err)
        if status == "STOPPED" and event.get("restart_if_stopped"):
            self.log.warning("Ray job %s, which this try re-attached to, was stopped (an earlier try was killed "
                             "or cleared); submitting a fresh one", event.get("submission_id"))
            return self._run(context, self.hook(), may_restart=False)
        if status != "SUCCEEDED":
            from tpuflow.rayjob.failures import is_user_code_error

            error = UserCodeError if is_user_code_error(status, event.get("message", ""), event.get("log_tail", "")) else RayJobFailedError
            raise error(
                f"Ray job {event.get('submission_id')} ended {status}: {event.get('message', '')}\n"
                f"--- last lines of the driver log ---\n{event.get('log_tail', '')}"
            )
        return self._check_result(event.get("result") or {})

    def _check_result(self, result: dict[str, Any]) -> dict[str, Any]:
        for key, minimum in self.min_result.items():
            value = result.get(key)
            if not isinstance(value, int | float) or value < float(minimum):
                raise QualityGateError(f"quality gate: {key}={value!r} is below the required {minimum}; not continuing")
        return result

    def on_kill(self) -> None:
        if self._active_submission_id:
            self.log.info("Task killed: stopping Ray job %s", self._active_submission_id)
            self.hook().stop_job(self._active_submission_id)
