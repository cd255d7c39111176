"""Typed operators for the two Ray jobs every pipeline has: data preparation and training.

Both are RaySubmitJobOperator underneath (same identity, re-attach, logs, result); they only
build the entrypoint. Training derives its ScalingConfig from the TPU slice catalog.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpuflow.arguments import RUN_TIME, ArgumentCheck
from tpuflow.errors import UserInputError
from tpuflow.output_links import OutputsLink
from tpuflow.rayjob.budget import TrainingBudget
from tpuflow.rayjob.operators import RaySubmitJobOperator
from tpuflow.storage import remove_tree
from tpuflow.tpu.slice_argument import FIELD as SLICE_FIELD
from tpuflow.tpu.slice_argument import resolve_slice
from tpuflow.validation import check_count, check_mapping, check_train_loop_config

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.tpu import TpuSlice
    from tpuflow.tpu.slice_argument import SliceArgument

FRAMEWORKS = ("jax", "torch")
RESUME_POLICIES = ("auto", "never")
TORCH_BACKENDS = ("gloo", "tpu_dist")  # TorchConfig(backend=...) on a TPU slice: host CPUs, or TorchTPU's chips
SCORE_ORDERS = ("max", "min")
REUSED_FINISHED = (
    "reusing the finished checkpoint %s of an earlier run of this date: 0 steps trained; "
    "set Param resume=never to train again"
)
_FRESH_RUN = re.compile(r"-fresh\d+$")  # the runs tpuflow_driver.train starts for resume="never"
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def module_entrypoint(module: str, arguments: dict[str, Any]) -> list[str]:
    """`python -m module --key value ...` as an argument list (quoted with shlex.join when submitted)."""
    argv = ["python", "-m", module]
    for key, value in arguments.items():
        if value is None or value is False:
            continue
        flag = f"--{key.replace('_', '-')}"
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def ray_slice(value: Any) -> TpuSlice:
    """The TpuSlice a (rendered) ``tpu_slice`` argument names, in a shape Ray can place."""
    return resolve_slice(value, ray=True)


def check_multislice(tpu: Any, framework: Any, *, simulated: bool, field: str = f"{SLICE_FIELD}.num_slices") -> None:
    """Reject a multi-slice run Ray 2.60 cannot train (a topology Ray cannot place is rejected for any
    num_slices by TpuSlice.require(ray=True)).

    Ray Train sets the multi-slice environment (MEGASCALE_*) for JaxTrainer with use_tpu, and for
    TorchTrainer only with the tpu_dist backend on TPU chips; simulated hosts run torch on gloo.
    """
    if tpu.num_slices > 1 and framework == "torch" and simulated:
        raise UserInputError(
            field,
            tpu.num_slices,
            "Ray 2.60 trains torch across slices only with TorchConfig(backend='tpu_dist') on TPU chips (it sets "
            "MEGASCALE_* for tpu_dist alone); simulated hosts run torch on gloo: use framework jax or one slice",
        )


_DICT_OR_UNSET = "give a dict (or leave it unset)"


def _check_choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserInputError(field, value, f"use one of {', '.join(choices)}")


def _check_nonempty(field: str, value: Any) -> None:
    if not (isinstance(value, str) and value.strip()):
        raise UserInputError(field, value, "give a non-empty string")


def _check_dict(field: str, value: Any, fix: str) -> None:
    if value is not None and not isinstance(value, dict):
        raise UserInputError(field, value, fix)


def _check_module(value: Any) -> None:
    if not (isinstance(value, str) and _MODULE.match(value)):
        raise UserInputError("module", value, 'give a dotted module name, e.g. "my_pkg.prep"')


def _check_train_loop(value: Any) -> None:
    if not (isinstance(value, str) and ":" in value):
        raise UserInputError("train_loop", value, 'give "module:function", e.g. "my_pkg.fit:train_loop"')


def _check_run_name(value: str) -> None:
    """A name of its own: not a path, not one of resume="never"'s fresh runs (the non-empty check came first)."""
    if "/" in value or _FRESH_RUN.search(value):
        raise UserInputError(
            "run_name", value, 'give a name without "/" that does not end in -fresh<N> (resume="never"\'s)'
        )


class RayDataPrepOperator(RaySubmitJobOperator):
    """Run a Ray Data preparation module (``python -m <module> --arg value ...``) as a Ray job.

    Everything else (identity, re-attach, log streaming, result, kill) is RaySubmitJobOperator's;
    its arguments (cluster, ray_conn_id, working_dir, runtime_env, env_vars, deferrable, poll_interval,
    job_timeout, min_result, log_uri, ...) apply here too, except ``entrypoint``, which this builds.

    :param module: the module to run, e.g. "my_pkg.prep"; templated.
    :param arguments: its command-line arguments, ``{"output_dir": ..., "num_train": ...}`` (each key
        becomes ``--key-name value``; True: a bare flag; None/False: left out). ``output_dir``, when
        given, is the task's Outputs link; templated.
    :param replace_output_dir: empty ``output_dir`` before each new job (never when a retry re-attaches to its
        job), so a rerun or resumed run replaces what an earlier attempt wrote instead of adding to it (Ray Data
        writes files under new names: an earlier attempt's would be read again). Off by default: only for a
        folder the job owns whole (the pipeline's RUN/data).
    """

    work_cause = "data_prep"
    template_fields: Sequence[str] = (*RaySubmitJobOperator.template_fields, "module", "arguments")
    template_fields_renderers = {**RaySubmitJobOperator.template_fields_renderers, "arguments": "json"}
    operator_extra_links = (*RaySubmitJobOperator.operator_extra_links, OutputsLink())

    def __init__(
        self,
        *,
        module: str,
        arguments: dict[str, Any] | None = None,
        replace_output_dir: bool = False,
        gcp_conn_id: str = "google_cloud_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.module = module
        self.arguments = arguments
        self.replace_output_dir = replace_output_dir
        self.gcp_conn_id = gcp_conn_id

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.module,), lambda: _check_module(self.module)),
            (
                (self.arguments,),
                lambda: _check_dict("arguments", self.arguments, "give the module's arguments as a dict"),
            ),
        ]

    def build_entrypoint(self, context: Context) -> list[str]:
        return module_entrypoint(self.module, self.arguments or {})

    def output_uri(self) -> str | None:
        return (self.arguments or {}).get("output_dir")

    def before_submit(self, context: Context) -> None:
        folder = self.output_uri()
        if not (self.replace_output_dir and folder):
            return
        removed = remove_tree(str(folder), self.gcp_conn_id)
        if removed:
            self.log.info("Replacing an earlier attempt's output: removed %d file(s) under %s", removed, folder)


class RayTrainOperator(RaySubmitJobOperator):
    """Train with Ray Train (JaxTrainer or TorchTrainer) on exactly one TPU slice shape.

    Everything else (identity, re-attach, log streaming, result, kill) is RaySubmitJobOperator's;
    its arguments (cluster, ray_conn_id, working_dir, runtime_env, env_vars, deferrable, poll_interval,
    job_timeout, min_result, log_uri, ...) apply here too, except ``entrypoint``, which this builds.

    :param framework: "jax" (ray.train.v2.jax.JaxTrainer) or "torch" (TorchTrainer); templated.
    :param train_loop: import path of the user's train_loop_per_worker, "module:function"; templated.
    :param tpu_slice: the slice to train on (tpuflow.tpu.slice_argument): a TpuSlice
        (``TpuSlice.from_spec("v6e", "4x4")``), its ``to_dict()``, or ``{"accelerator": "TPU-V6E", "topology":
        "4x4", "machine_type"?, "num_slices"?}`` whose values may be templates (machine_type default: the
        generation's; num_slices: identical slices, multislice); templated.
    :param storage_path: checkpoints and results (local path or gs://): Ray Train's
        RunConfig(storage_path). The task's Outputs link; templated.
    :param run_name: Ray Train's run name under storage_path (RunConfig(name)); templated.
    :param datasets: {"train": parquet path, ...} read with Ray Data and sharded to the workers; templated.
    :param train_loop_config: the dict passed to train_loop_per_worker; templated.
    :param max_failures: worker-group restarts Ray Train allows, each from the latest checkpoint
        (FailureConfig.max_failures; -1: no limit, 0: none).
    :param checkpoint_num_to_keep: checkpoints kept under storage_path (CheckpointConfig.num_to_keep;
        None: all).
    :param checkpoint_score_attribute: the reported metric that decides which checkpoints are kept
        (CheckpointConfig.checkpoint_score_attribute; None: the most recent). The XCom then also names
        the best kept one as ``best_checkpoint``; ``checkpoint`` stays the latest.
    :param checkpoint_score_order: "max" or "min" (CheckpointConfig.checkpoint_score_order; None: Ray's
        default, "max"); needs checkpoint_score_attribute.
    :param torch_backend: TorchConfig(backend=...) of a torch run: "gloo" (host CPUs) or "tpu_dist"
        (TorchTPU on the chips); None: tpu_dist on GKE, gloo on simulated hosts.
    :param resume: "auto" resumes the latest run of run_name under storage_path from its latest
        checkpoint (a rerun of a finished run trains 0 steps; the log and the XCom's
        ``reused_finished`` / ``resumed_from`` say so); "never" trains from scratch in a new run,
        run_name-fresh<N>, keeping every earlier checkpoint; templated.
    :param worker_env: environment variables of the training workers (on top of the slice's own), e.g. a token:
        sent in the job's runtime_env (``env_vars``, which Ray gives the driver and every worker of the job), never
        on its command line or in the logged training spec; values of sensitive names (``HF_TOKEN``, ``*_API_KEY``:
        Airflow's list) are masked in the task log.
    :param compilation_cache: a jax run keeps JAX's persistent compilation cache under storage_path (or under
        the folder given instead, local or gs://), per slice shape and JAX/jaxlib/libtpu version, so a retried,
        resumed or next-day run skips compiling (tpuflow_driver.compile_cache); False: no cache.
    :param budget: a TrainingBudget (tpuflow.rayjob.budget) the training is held to, e.g. the run's chip-hour
        budget, tpuflow.cost.training.ChipHourBudget: when the job starts, the seconds left become its timeout
        (none left: the task fails before submitting anything); when that timeout stops the job, the task fails
        without a retry, the checkpoints kept. Its own template_fields are rendered with the task's. None
        (default): no budget.
    """

    work_cause = "training"
    template_fields: Sequence[str] = (
        *RaySubmitJobOperator.template_fields,
        "framework",
        "train_loop",
        "tpu_slice",
        "storage_path",
        "run_name",
        "datasets",
        "train_loop_config",
        "resume",
        "budget",
    )
    template_fields_renderers = {
        **RaySubmitJobOperator.template_fields_renderers,
        "datasets": "json",
        "train_loop_config": "json",
    }
    operator_extra_links = (*RaySubmitJobOperator.operator_extra_links, OutputsLink())

    def __init__(
        self,
        *,
        framework: str,
        train_loop: str,
        tpu_slice: SliceArgument,
        storage_path: str,
        run_name: str,
        datasets: dict[str, str] | None = None,
        train_loop_config: dict[str, Any] | None = None,
        max_failures: int = 2,
        checkpoint_num_to_keep: int | None = 2,
        checkpoint_score_attribute: str | None = None,
        checkpoint_score_order: str | None = None,
        torch_backend: str | None = None,
        resume: str = "auto",
        worker_env: dict[str, str] | None = None,
        compilation_cache: bool | str = True,
        budget: TrainingBudget | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.budget = budget
        self.compilation_cache = compilation_cache
        self.framework = framework
        self.train_loop = train_loop
        self.tpu_slice = tpu_slice
        self.storage_path = storage_path
        self.run_name = run_name
        self.datasets = datasets
        self.train_loop_config = train_loop_config
        self.max_failures = max_failures
        self.checkpoint_num_to_keep = checkpoint_num_to_keep
        self.checkpoint_score_attribute = checkpoint_score_attribute
        self.checkpoint_score_order = checkpoint_score_order
        self.torch_backend = torch_backend
        self.resume = resume
        self.worker_env = worker_env

    def argument_checks(self) -> list[ArgumentCheck]:
        """The training arguments, as Ray Train and the driver would take them: rejected before submitting."""
        return [
            *super().argument_checks(),
            ((self.framework,), lambda: _check_choice("framework", self.framework, FRAMEWORKS)),
            ((self.train_loop,), lambda: _check_train_loop(self.train_loop)),
            ((self.resume,), lambda: _check_choice("resume", self.resume, RESUME_POLICIES)),
            ((self.storage_path,), lambda: _check_nonempty("storage_path", self.storage_path)),
            ((self.run_name,), lambda: _check_nonempty("run_name", self.run_name)),
            ((self.run_name,), lambda: _check_run_name(self.run_name)),
            ((self.datasets,), lambda: _check_dict("datasets", self.datasets, _DICT_OR_UNSET)),
            (
                (self.train_loop_config,),
                lambda: _check_dict("train_loop_config", self.train_loop_config, _DICT_OR_UNSET),
            ),
            ((self.tpu_slice,), self._tpu_slice),
            ((self.train_loop_config,), self._check_train_loop_config),
            ((), self._check_ray_train_configs),  # never templated
            ((self.framework,), self._check_torch_backend_framework),
            ((), lambda: check_mapping("worker_env", self.worker_env)),
            ((), self._check_budget),  # an object, never a template itself
            # Checked only once rendered: the cluster the task is handed says whether its hosts are simulated.
            ((RUN_TIME,), lambda: check_multislice(self._tpu_slice(), self.framework, simulated=self._simulated())),
        ]

    def _check_budget(self) -> None:
        if self.budget is not None and not isinstance(self.budget, TrainingBudget):
            raise UserInputError(
                "budget",
                type(self.budget).__name__,
                "give a tpuflow.rayjob.budget.TrainingBudget, e.g. tpuflow.cost.training.ChipHourBudget(...), or None",
            )

    # --- the budget: the job's timeout is the budget left; a stop at it fails without a retry ---------------
    def _submit_and_follow(self, context: Context, *, may_restart: bool) -> Any:
        if self.budget is not None:
            from airflow.sdk.exceptions import AirflowFailException

            note = self.budget.held_note()
            if note:
                self.log.warning("%s", note)
            left, said = self.budget.seconds_left(context)
            if left is not None:
                if left <= 0:
                    raise AirflowFailException(f"budget spent before training ({said}); nothing submitted")
                if left != float("inf") and (self.job_timeout is None or left < float(self.job_timeout)):
                    self.log.info("Budget: %s; the job is stopped in %.0f s unless it ends first", said, left)
                    self.job_timeout = left
        return super()._submit_and_follow(context, may_restart=may_restart)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        if self.budget is not None and isinstance(event, dict) and event.get("status") == "timeout":
            from airflow.sdk.exceptions import AirflowFailException

            left, said = self.budget.seconds_left(context)
            if left is not None and left < float(self.poll_interval) + 5:
                self._owned = None
                self._keep_log(context, event)
                raise AirflowFailException(self.budget.spent_message(said, str(self.storage_path)))
        return super().execute_complete(context, event)

    def _check_train_loop_config(self) -> None:
        if isinstance(self.train_loop_config, dict):
            check_train_loop_config("train_loop_config", self.train_loop_config)

    def _check_ray_train_configs(self) -> None:
        """FailureConfig, CheckpointConfig and TorchConfig's backend, as Ray Train would take them."""
        check_count("max_failures", self.max_failures, minimum=-1, what="a whole number (-1: no limit)")
        if self.checkpoint_num_to_keep is not None:  # None: keep every checkpoint
            check_count("checkpoint_num_to_keep", self.checkpoint_num_to_keep, minimum=1)
        attribute, order = self.checkpoint_score_attribute, self.checkpoint_score_order
        if attribute is not None and not (isinstance(attribute, str) and attribute.strip()):
            raise UserInputError(
                "checkpoint_score_attribute", attribute, "give the name of a metric the train loop reports, or None"
            )
        if order is not None and order not in SCORE_ORDERS:
            raise UserInputError("checkpoint_score_order", order, f"use one of {', '.join(SCORE_ORDERS)} (or None)")
        if order is not None and attribute is None:
            raise UserInputError(
                "checkpoint_score_order", order, "set checkpoint_score_attribute too: the metric the order applies to"
            )
        if self.torch_backend is not None and self.torch_backend not in TORCH_BACKENDS:
            raise UserInputError(
                "torch_backend", self.torch_backend, f"use one of {', '.join(TORCH_BACKENDS)} (or None)"
            )

    def _check_torch_backend_framework(self) -> None:
        if self.torch_backend is not None and self.framework != "torch":
            raise UserInputError(
                "torch_backend", self.torch_backend, "leave it unset: it is TorchConfig's, for framework torch"
            )

    def _simulated(self) -> bool:
        """Whether the cluster's hosts are simulated (the local backend)."""
        return self._cluster_info().get("backend") == "local"

    def _tpu_slice(self) -> TpuSlice:
        """The slice ``tpu_slice`` names (raises UserInputError naming ``tpu_slice.<key>``)."""
        return ray_slice(self.tpu_slice)

    def build_spec(self) -> dict[str, Any]:
        """The training spec tpuflow_driver.train runs (arguments already validated)."""
        tpu = self._tpu_slice()
        simulated = self._simulated()
        spec: dict[str, Any] = {
            "framework": self.framework,
            "train_loop": self.train_loop,
            "train_loop_config": self.train_loop_config or {},
            "scaling_config": tpu.scaling_config(),
            # The driver picks the run: "auto" the latest of run_name's under storage_path (Ray Train
            # resumes it), "never" a new one; it says which, and whether a finished checkpoint was reused.
            "run_name": self.run_name,
            "resume": self.resume,
            "storage_path": self.storage_path,
            "datasets": self.datasets or {},
            "max_failures": self.max_failures,
            "checkpoint_num_to_keep": self.checkpoint_num_to_keep,
            # JAX's persistent compilation cache under storage_path (tpuflow_driver.compile_cache)
            "compilation_cache": self.compilation_cache,
            **{
                key: getattr(self, key)
                for key in ("checkpoint_score_attribute", "checkpoint_score_order")
                if getattr(self, key) is not None
            },
            # the slice's own only: the user's worker_env travels in the runtime_env (build_runtime_env) and wins
            "worker_env": {
                key: value
                for key, value in {**({"JAX_PLATFORMS": "cpu"} if simulated else {}), **tpu.ray_env}.items()
                if key not in (self.worker_env or {})
            },
        }
        scaling = spec["scaling_config"]
        if simulated and tpu.multi_host and tpu.num_slices == 1 and "TPU" in scaling.get("resources_per_worker", {}):
            # A v5e/v6e topology of <= 8 chips on smaller VMs (2x4 as two 4-chip hosts): Ray reads it as one VM
            # and then reserves no slice by name (ray.util.tpu.get_chips_per_host), so on a cluster of several
            # such slices the workers could straddle two. Each simulated host carries its slice's name as a
            # unit resource: pin the workers to one slice.
            scaling["resources_per_worker"] = {**scaling["resources_per_worker"], self._slice_resource(0): 1}
        if self.framework == "torch":
            # TorchTPU: one worker per TPU device (seed tutorial, FSDP2 on TPU), through Ray's own TPU path on
            # simulated hosts too, where torch_tpu is tpuflow's CPU stand-in (workloads/simulated_tpu) and the
            # collectives run on the hosts' CPUs with gloo.
            spec["torch_backend"] = self.torch_backend or ("gloo" if simulated else "tpu_dist")
            spec["scaling_config"] = tpu.torch_scaling_config()
            if simulated and self._slice_resource(0) in scaling.get("resources_per_worker", {}):
                # pinned to one slice as above: each worker takes its share of its host's unit slice resource
                per_worker = spec["scaling_config"]["resources_per_worker"]
                per_worker[self._slice_resource(0)] = 1 / tpu.logical_devices_per_host
        return spec

    def task_end(self) -> None:
        """A training job's success resumes the task on a worker: it may warn that a finished run was
        reused (below), and a worker start is small against a training run."""
        return None

    def _check_result(self, result: dict[str, Any]) -> dict[str, Any]:
        if result.get("reused_finished"):
            self.log.warning(REUSED_FINISHED, result.get("resumed_from") or result.get("checkpoint"))
        return super()._check_result(result)

    def _slice_resource(self, index: int) -> str:
        """The unit resource each simulated host of slice ``index`` carries."""
        from tpuflow.local.cluster import slice_name

        return slice_name(str(self._cluster_info().get("name")), index)

    def build_entrypoint(self, context: Context) -> list[str]:
        spec = self.build_spec()
        self.log.info("Training spec:\n%s", json.dumps(spec, indent=2))
        return ["python", "-m", "tpuflow_driver.train", "--spec-json", json.dumps(spec)]

    def build_runtime_env(self) -> dict[str, Any]:
        env = super().build_runtime_env()
        # Ray Train's controller polls workers every 2 s by default; each report then blocks that long.
        env["env_vars"] = {
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
            **env.get("env_vars", {}),
            **{str(key): str(value) for key, value in (self.worker_env or {}).items()},
        }
        return env

    def output_uri(self) -> str | None:
        return self.storage_path
