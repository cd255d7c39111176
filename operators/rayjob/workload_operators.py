"""Typed operators for the two Ray jobs every pipeline has: data preparation and training.

Both are RaySubmitJobOperator underneath (same identity, re-attach, logs, result); they only
build the entrypoint. Training derives its ScalingConfig from the TPU slice catalog.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpuflow.errors import UserInputError
from tpuflow.output_links import OutputsLink
from tpuflow.rayjob.operators import RaySubmitJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

FRAMEWORKS = ("jax", "torch")
RESUME_POLICIES = ("auto", "never")


def module_entrypoint(module: str, arguments: dict[str, Any]) -> str:
    """`python -m module --key value ...` with every value shell-quoted."""
    parts = ["python", "-m", module]
    for key, value in arguments.items():
        if value is None or value is False:
            continue
        flag = f"--{key.replace('_', '-')}"
        parts.append(flag if value is True else f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


class RayDataPrepOperator(RaySubmitJobOperator):
    """Run a Ray Data preparation module (`python -m <module> --arg value ...`) as a Ray job."""

    template_fields: Sequence[str] = (*RaySubmitJobOperator.template_fields, "module", "arguments")
    template_fields_renderers = {**RaySubmitJobOperator.template_fields_renderers, "arguments": "json"}
    operator_extra_links = (*RaySubmitJobOperator.operator_extra_links, OutputsLink())

    def __init__(self, *, module: str, arguments: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(entrypoint="", **kwargs)
        self.module = module
        self.arguments = arguments or {}

    def execute(self, context: Context) -> Any:
        OutputsLink.persist(context, uri=self.arguments.get("output_dir"))
        self.entrypoint = module_entrypoint(self.module, self.arguments)
        return super().execute(context)


class RayTrainOperator(RaySubmitJobOperator):
    """Train with Ray Train (JaxTrainer or TorchTrainer) on exactly one TPU slice shape.

    :param framework: "jax" (ray.train.v2.jax.JaxTrainer) or "torch" (TorchTrainer).
    :param train_loop: import path of the user's train_loop_per_worker, "module:function".
    :param accelerator/topology/machine_type/num_slices: the slice; ScalingConfig derives from it.
    :param storage_path: checkpoints and results (local path or gs://); a resubmitted run with the
        same run_name resumes from its latest checkpoint there.
    :param datasets: {"train": parquet path, ...} read with Ray Data and sharded to the workers.
    :param resume: "auto" resumes from the latest checkpoint; "never" starts from scratch.
    """

    template_fields: Sequence[str] = (
        *RaySubmitJobOperator.template_fields, "framework", "train_loop", "accelerator", "topology",
        "machine_type", "num_slices", "storage_path", "run_name", "datasets", "train_loop_config", "resume",
    )
    template_fields_renderers = {
        **RaySubmitJobOperator.template_fields_renderers, "datasets": "json", "train_loop_config": "json",
    }
    operator_extra_links = (*RaySubmitJobOperator.operator_extra_links, OutputsLink())

    def __init__(
        self,
        *,
        framework: str,
        train_loop: str,
        accelerator: str,
        topology: str,
        storage_path: str,
        run_name: str,
        machine_type: str | None = None,
        num_slices: int | str = 1,
        datasets: dict[str, str] | None = None,
        train_loop_config: dict[str, Any] | None = None,
        max_failures: int = 2,
        checkpoint_num_to_keep: int = 2,
        resume: str = "auto",
        worker_env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(entrypoint="", **kwargs)
        self.framework = framework
        self.train_loop = train_loop
        self.accelerator = accelerator
        self.topology = topology
        self.machine_type = machine_type
        self.num_slices = num_slices
        self.storage_path = storage_path
        self.run_name = run_name
        self.datasets = datasets or {}
        self.train_loop_config = train_loop_config or {}
        self.max_failures = max_failures
        self.checkpoint_num_to_keep = checkpoint_num_to_keep
        self.resume = resume
        self.worker_env = worker_env or {}

    def build_spec(self, try_number: int = 1) -> dict[str, Any]:
        from tpuflow.tpu import TpuSlice

        if self.framework not in FRAMEWORKS:
            raise UserInputError("framework", self.framework, f"use one of {', '.join(FRAMEWORKS)}")
        if ":" not in self.train_loop:
            raise UserInputError("train_loop", self.train_loop, 'give "module:function", e.g. "addition.train_jax:train_loop_per_worker"')
        if self.resume not in RESUME_POLICIES:
            raise UserInputError("resume", self.resume, f"use one of {', '.join(RESUME_POLICIES)}")
        tpu = TpuSlice.from_spec(self.accelerator, self.topology, self.machine_type or None, self.num_slices)
        tpu.require(ray=True)
        simulated = self._cluster_info().get("backend") == "local"
        spec: dict[str, Any] = {
            "framework": self.framework,
            "train_loop": self.train_loop,
            "train_loop_config": self.train_loop_config,
            "scaling_config": tpu.scaling_config(),
            # Ray Train resumes a run from the latest checkpoint under storage_path/run_name;
            # "never" gives every try its own run, so nothing is resumed.
            "run_name": self.run_name if self.resume == "auto" else f"{self.run_name}-try{try_number}",
            "storage_path": self.storage_path,
            "datasets": self.datasets,
            "max_failures": self.max_failures,
            "checkpoint_num_to_keep": self.checkpoint_num_to_keep,
            "worker_env": {**({"JAX_PLATFORMS": "cpu"} if simulated else {}), **tpu.ray_env, **self.worker_env},
        }
        if self.framework == "torch":
            # On real chips TorchTPU wants one worker per TPU device (seed tutorial, FSDP2 on TPU).
            # Simulated hosts have no chips (Ray Train's TPU device manager needs torch_tpu), so torch
            # runs data-parallel on their CPUs with gloo, one worker per host: each simulated host
            # carries its slice's name as a unit resource, which pins the workers to that slice.
            spec["torch_backend"] = "gloo" if simulated else "tpu_dist"
            spec["scaling_config"] = tpu.torch_scaling_config()
            if simulated:
                pin = {f"{self._cluster_info().get('name')}-slice-0": 1} if tpu.num_slices == 1 else {}
                spec["scaling_config"] = {"use_tpu": False, "num_workers": tpu.total_hosts,
                                          "resources_per_worker": {"CPU": 1, **pin}}
        return spec

    def execute(self, context: Context) -> Any:
        OutputsLink.persist(context, uri=self.storage_path)
        spec = self.build_spec(getattr(context["ti"], "try_number", 1))
        self.log.info("Training spec:\n%s", json.dumps(spec, indent=2))
        self.entrypoint = f"python -m tpuflow_driver.train --spec-json {shlex.quote(json.dumps(spec))}"
        # Ray Train's controller polls workers every 2 s by default; each report then blocks that long.
        self.env_vars = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", **self.env_vars}
        return super().execute(context)
