"""The pipeline's own small steps (Param check, Serve config, report) as thin operators.

They are operators rather than ``@task`` functions so that parsing a DAG file does not pull in the
TaskFlow machinery (airflow.sdk's decorators import the standard provider's PythonOperator, the
virtualenv helpers and ``packaging``), which used to be half the pipeline DAGs' parse cost.
Arguments listed in ``template_fields`` are rendered (Jinja, and XComArgs resolved) before
``execute``, as a ``@task``'s arguments were; each returns its result as the task's XCom.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.errors import UserInputError
from tpuflow.pipeline.params import validate_params
from tpuflow.serve.deployment_options import DeploymentOptions
from tpuflow.storage import check_writable, emulator_env, write_text
from tpuflow.tpu.slice_argument import resolve_slice

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.pipeline.workload import Workload
    from tpuflow.tpu import TpuSlice


class CheckParamsOperator(BaseOperator):
    """Reject a bad accelerator/topology pair (or other Param), a step of the workload that is not where its
    import path says (for the run's framework, found without importing it: ``Workload.check_code``; a step
    whose package this machine cannot see is not judged), a Param the workload cannot train with, or an
    output folder the run cannot write (a malformed gs:// URI, a missing bucket, credentials without write
    access), before anything is started.

    :param output_dir: the run's output folder (local or gs://BUCKET/PREFIX); None: not checked.
    :param gcp_conn_id: Airflow connection whose credentials write a gs:// output folder; templated.
    :param workload: the pipeline's workload; its ``check_params`` function (if any) checks the Params too.
    """

    template_fields: Sequence[str] = ("output_dir", "gcp_conn_id")
    ui_color = "#e8f5e9"

    def __init__(
        self,
        *,
        output_dir: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        workload: Workload | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.output_dir = output_dir
        self.gcp_conn_id = gcp_conn_id
        self.workload = workload

    def check(self, params: dict[str, Any]) -> dict[str, Any]:
        return validate_params(params)

    def execute(self, context: Context) -> dict[str, Any]:
        params = dict(context["params"])
        checked = self.check(params)
        if self.workload is not None:
            if self.workload.serve_app is None:  # no serve slice: nothing is deployed (nor its quota checked)
                checked.pop("serve", None)
            self.workload.check_code([params["framework"]])
            workload_check = self.workload.load_check()
            if workload_check is not None:
                workload_check(params)
        if self.output_dir:
            check_writable(self.output_dir, "output_dir", self.gcp_conn_id)
        return checked


class BuildServeConfigOperator(ArgumentChecks, BaseOperator):
    """The Serve config of the trained model on ``cluster``: one application, the workload's ``serve_app``.

    :param workload: the pipeline's workload (its ``serve_app``, ``app_name`` and ``serve_deployment``).
    :param cluster: the cluster-start task's XCom (its connection info; ``backend``, ``serve_port``); templated.
    :param trained: the train task's XCom (``checkpoint``: the checkpoint to serve); templated.
    :param workloads_uri: the Serve application's runtime_env working_dir as the Ray cluster sees it; templated.
    :param deployment_options: Serve settings of the endpoint (tpuflow.serve.deployment_options.DeploymentOptions
        or a dict of its fields: num_replicas or autoscaling_config, max_ongoing_requests, max_queued_requests,
        request_timeout_s, user_config (over the workload's serve_user_config), ...); templated.
    :param tpu_slice: the slice the replicas serve from (tpuflow.tpu.slice_argument: a TpuSlice, its to_dict()
        such as check_params' ``serve``, or {"accelerator", "topology", ...}); None: CPU replicas; templated.
    :param code_uri: the workload's code as the Ray cluster sees it (a ``py_modules`` entry: local:// folder
        or a remote zip); None: the app's modules are importable there already; templated.
    """

    template_fields: Sequence[str] = (
        "cluster",
        "trained",
        "workloads_uri",
        "deployment_options",
        "tpu_slice",
        "code_uri",
    )

    def __init__(
        self,
        *,
        workload: Workload,
        cluster: Any,
        trained: Any,
        workloads_uri: str,
        deployment_options: Any = None,
        tpu_slice: Any = None,
        code_uri: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.workload = workload
        self.code_uri = code_uri
        self.cluster = cluster
        self.trained = trained
        self.workloads_uri = workloads_uri
        self.deployment_options = deployment_options
        self.tpu_slice = tpu_slice

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((), self._check_serve_app),  # the workload is never templated
            ((self.cluster,), self._check_cluster),
            ((self.trained,), self._check_trained),
            ((self.workloads_uri,), lambda: _check_nonempty_text("workloads_uri", self.workloads_uri)),
            ((self.deployment_options,), self._check_deployment_options),
            ((self.tpu_slice,), lambda: self.tpu_slice is None or resolve_slice(self.tpu_slice)),
        ]

    def _check_serve_app(self) -> None:
        if self.workload.serve_app is None:
            raise UserInputError("workload.serve_app", None, "give the Serve app's import path to build its config")

    def _check_cluster(self) -> None:
        if not isinstance(self.cluster, dict):
            raise UserInputError("cluster", self.cluster, "pass the cluster-start task's XCom (a dict)")

    def _check_trained(self) -> None:
        if not (isinstance(self.trained, dict) and self.trained.get("checkpoint")):
            raise UserInputError("trained", self.trained, 'pass the train task\'s XCom (a dict with its "checkpoint")')

    def _check_deployment_options(self) -> None:

        options = DeploymentOptions.from_value(self.deployment_options)
        if not options.is_empty() and self.workload.serve_deployment is None:
            raise UserInputError(
                "workload.serve_deployment", None, "name the app's deployment that deployment_options configure"
            )

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate_arguments()
        return serve_config_for(
            self.cluster,
            self.trained,
            self.workloads_uri,
            context["params"]["framework"],
            None if self.tpu_slice is None else resolve_slice(self.tpu_slice),
            deployment_options=self.deployment_options,
            workload=self.workload,
            code_uri=self.code_uri,
        )


def serve_config_for(
    cluster: dict[str, Any],
    trained: dict[str, Any],
    workloads_uri: str,
    framework: str,
    tpu_slice: TpuSlice | Mapping[str, Any] | None = None,
    *,
    workload: Workload,
    deployment_options: Any = None,
    code_uri: str | None = None,
) -> dict[str, Any]:
    """The workload's Serve app config; with ``tpu_slice`` its replicas are placed on that TPU slice.

    ``code_uri``: the workload's code for the replicas' runtime_env ``py_modules`` (None: none shipped)."""
    from tpuflow.serve.config import check_tpu_placement, serve_application, serve_config, serve_tpu_args

    options = DeploymentOptions.from_value(deployment_options)
    name, import_path = workload.app_name, workload.serve_app
    if name is None or import_path is None:
        raise UserInputError("workload.serve_app", import_path, "give the Serve app's import path to build its config")
    if not options.is_empty() and workload.serve_deployment is None:
        raise UserInputError(
            "workload.serve_deployment", None, "name the app's deployment that deployment_options configure"
        )
    local = cluster.get("backend") == "local"
    tpu = None if tpu_slice is None else resolve_slice(tpu_slice)
    # The replicas load the checkpoint themselves: with a GCS emulator they must be told where it is.
    # Simulated TPU hosts run JAX on CPU, as training does.
    env_vars = {**emulator_env(), **({"JAX_PLATFORMS": "cpu"} if local and tpu else {}), **(tpu.ray_env if tpu else {})}
    runtime_env = {
        "working_dir": workloads_uri,
        **({"py_modules": [code_uri]} if code_uri else {}),
        **({"env_vars": env_vars} if env_vars else {}),
    }
    app = serve_application(
        name,
        import_path,
        route_prefix=f"/{name}",
        args={
            "checkpoint": trained["checkpoint"],
            "framework": framework,
            "model_name": name,
            **(serve_tpu_args(tpu) if tpu else {}),
        },
        runtime_env=runtime_env,
        deployments=_deployments(workload, options),
    )
    port = cluster.get("serve_port") if local else None
    config = serve_config([app], http_port=port)
    if options.http_options():
        config["http_options"] = {**config.get("http_options", {}), **options.http_options()}
    check_tpu_placement(config, tpu)
    return config


def _deployments(workload: Workload, options: Any) -> list[dict[str, Any]] | None:
    """The app's ``deployments:`` entry (deployment_options over the workload's user_config defaults), checked
    by the workload's check_serve_user_config; None: nothing to override."""
    if options.is_empty() and not workload.serve_user_config:
        return None
    entry = options.deployment_entry(str(workload.serve_deployment), user_config_defaults=workload.serve_user_config)
    check = workload.load_check("check_serve_user_config")
    if check is not None:
        check(dict(entry.get("user_config") or {}), entry)
    return [entry]


class WriteReportOperator(ArgumentChecks, BaseOperator):
    """The run's report (accuracy, a sample completion, the endpoint: each of a step the pipeline has, REPORT_KEYS)
    as report.json in ``output_dir``.

    :param output_dir: the run's output folder (local path, or a remote URI where only the XCom is kept); templated.
    :param evaluation: the evaluate task's XCom (``accuracy``, ``n``); None: the pipeline has no evaluation; templated.
    :param answer: the smoke test's XCom (the endpoint's completion); None: no smoke test; templated.
    :param deployed: the deploy task's XCom (``serve_url``); None: nothing deployed; templated.
    :param sample_prompt: the smoke test's prompt, as the report shows it.
    :param endpoint_path: the endpoint's API under the deploy's ``serve_url``, e.g. "/app/v1".
    """

    template_fields: Sequence[str] = ("output_dir", "evaluation", "answer", "deployed")
    # The train task whose XCom the report's "training" summarises (resumed / reused checkpoint); None: none.
    train_task_id: str | None = "train"

    def __init__(
        self,
        *,
        output_dir: str,
        evaluation: Any = None,
        answer: Any = None,
        deployed: Any = None,
        sample_prompt: str | None = None,
        endpoint_path: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.output_dir = output_dir
        self.evaluation = evaluation
        self.answer = answer
        self.deployed = deployed
        self.sample_prompt = sample_prompt
        self.endpoint_path = endpoint_path
        # Which inputs the pipeline has: a wired one must carry its task's XCom once rendered.
        self._wired = {f for f in ("evaluation", "answer", "deployed") if getattr(self, f) is not None}

    def argument_checks(self) -> list[ArgumentCheck]:
        wired = [f for f in ("evaluation", "answer", "deployed") if f in self._wired]
        return [
            *super().argument_checks(),
            ((self.output_dir,), lambda: _check_nonempty_text("output_dir", self.output_dir)),
            *(((getattr(self, f),), partial(_check_xcom, f, getattr(self, f))) for f in wired),
            ((self.deployed,), self._check_deployed),
        ]

    def _check_deployed(self) -> None:
        if "deployed" in self._wired and not self.deployed.get("serve_url"):
            raise UserInputError("deployed", self.deployed, 'pass the deploy task\'s XCom (a dict with "serve_url")')

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate_arguments()
        return write_report(
            self.output_dir,
            self.evaluation,
            self.answer,
            self.deployed,
            sample_prompt=self.sample_prompt,
            endpoint_path=self.endpoint_path,
            training=self._training(context),
        )

    def _training(self, context: Context) -> dict[str, Any] | None:
        trained = context["ti"].xcom_pull(task_ids=self.train_task_id) if self.train_task_id else None
        return training_summary(trained) if isinstance(trained, dict) else None


def training_summary(trained: dict[str, Any]) -> dict[str, Any]:
    """The report's account of training from the train task's XCom (tpuflow_driver.train's result):
    which run, which checkpoint, and whether it resumed an earlier run's or reused a finished one."""
    summary = {key: trained.get(key) for key in ("run_name", "checkpoint", "resumed_from", "steps_trained")}
    summary["reused_finished"] = bool(trained.get("reused_finished"))
    if summary["reused_finished"]:
        summary["note"] = (
            f"reused the finished checkpoint {trained.get('resumed_from')} of an earlier run of this date: "
            "0 steps trained; set Param resume=never to train again"
        )
    return summary


def _check_nonempty_text(field: str, value: Any) -> None:
    if not (isinstance(value, str) and value.strip()):
        raise UserInputError(field, value, "give a non-empty string")


def _check_xcom(field: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise UserInputError(field, value, "pass the upstream task's XCom (a dict)")


# report.json's keys of each step a workload may lack (write_report): a run without the step has none of them.
REPORT_KEYS = {
    "evaluation": ("accuracy", "heldout_examples", "eval_examples_per_s", "eval_hosts"),
    "smoke_test": ("sample_prompt", "sample_completion"),
    "deploy": ("endpoint",),
}


def write_report(
    output_dir: str,
    evaluation: dict[str, Any] | None,
    answer: dict[str, Any] | None,
    deployed: dict[str, Any] | None,
    *,
    sample_prompt: str | None = None,
    endpoint_path: str = "",
    training: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """report.json: the run's output folder and training, and the keys of each step the pipeline has (REPORT_KEYS);
    a step it does not have (``evaluation``, ``answer`` or ``deployed`` None) has none of its keys in it."""

    report: dict[str, Any] = {"output_dir": output_dir}
    if evaluation is not None:
        report |= {
            "accuracy": evaluation.get("accuracy"),
            "heldout_examples": evaluation.get("n"),
            "eval_examples_per_s": evaluation.get("examples_per_s"),
            "eval_hosts": evaluation.get("hosts_used"),
        }
    if answer is not None:
        report |= {
            "sample_prompt": sample_prompt,
            "sample_completion": ((answer.get("choices") or [{}])[0] or {}).get("text") if answer else None,
        }
    if deployed is not None:
        report["endpoint"] = f"{deployed['serve_url']}{endpoint_path}" if deployed else None
    report["training"] = training  # training_summary(the train task's XCom)

    write_text(f"{output_dir.rstrip('/')}/report.json", json.dumps(report, indent=2))
    print(f"TPUFLOW_REPORT {json.dumps(report)}")
    return report
