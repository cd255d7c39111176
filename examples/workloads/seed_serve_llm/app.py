"""Seed 004's model (``google/gemma-4-E2B-it``) served with Ray Serve LLM on a TPU slice, written as a
team writes its own app builder: ``build_app(args)`` returns ``ray.serve.llm.build_openai_app`` over one
``LLMConfig``, an OpenAI-compatible API (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``).

Rendered as a KubeRay RayService for a multi-host slice (seed 000's ``accelerator_type`` plus
``accelerator_config: {kind: tpu, topology: "4x4"}``; the render derives both, and ``chips_per_host``,
from the slice and passes them as the builder's args):

    tpuflow render rayservice --accelerator TPU-V6E --topology 4x4 --image vllm/vllm-tpu:latest \\
        --import-path seed_serve_llm.app:build_app > rayservice.yaml

The pods need this package on their path (in the image, or a ``runtime_env`` in a ``--serve-config``
file) and vLLM's TPU build; neither Ray Serve LLM nor vLLM is imported until ``build_app`` runs, so the
module imports (and ``llm_config`` checks the args) where vLLM is not installed.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve import Application

MODEL_ID = "google/gemma-4-E2B-it"  # seed 004's model (gated: the pods need a Hugging Face token)
MAX_MODEL_LEN = 4096
# What the builder reads. The render adds accelerator_type, accelerator_config and chips_per_host on a
# multi-host slice (tpu_resource_per_chip too for two-device chips, which Serve LLM counts itself).
ARGS = frozenset(
    {"model_id", "model_source", "max_model_len", "num_replicas", "accelerator_type", "accelerator_config"}
    | {"chips_per_host", "tpu_resource_per_chip"}
)


class AppArgsError(ValueError):
    """An app arg this builder cannot serve with, named with its value and the fix."""

    def __init__(self, field: str, value: Any, fix: str) -> None:
        super().__init__(f"args.{field}={value!r} is invalid: {fix}")


def _chips(accelerator_config: dict[str, Any]) -> int:
    topology = str(accelerator_config.get("topology", ""))
    try:
        return prod(int(d) for d in topology.split("x"))
    except ValueError:
        raise AppArgsError("accelerator_config.topology", topology, 'give the slice shape, e.g. "4x4"') from None


def _check_hosts(accelerator_type: str, topology: str, chips_per_host: int) -> None:
    """Ray Serve LLM reserves one bundle per host as Ray reads the shape; the VMs must be that size."""
    from ray._private.accelerators.tpu import get_chips_per_host
    from ray.util.tpu import get_tpu_version_from_type

    ray_per_host = get_chips_per_host(topology, get_tpu_version_from_type(accelerator_type))
    if chips_per_host != ray_per_host:
        raise AppArgsError(
            "chips_per_host",
            chips_per_host,
            f"Ray Serve LLM places a {accelerator_type} {topology} slice as hosts of {ray_per_host} chips; "
            f"serve it on {ray_per_host}-chip VMs",
        )


def llm_config(args: dict[str, Any]) -> dict[str, Any]:
    """The one LLMConfig (``ray.serve.llm``) the app serves, as a plain dict: the model, vLLM's engine
    sharded over every chip of the slice (tensor parallel), one replica per slice unless told.

    The slice is required (without it Serve LLM places the model on GPUs): on a multi-host slice
    ``tpuflow render rayservice`` derives it; on a single host give it with ``--app-arg``.
    """
    unknown = sorted(set(args) - ARGS)
    if unknown:
        raise AppArgsError(unknown[0], args[unknown[0]], f"this builder reads only {sorted(ARGS)}")
    config: dict[str, Any] = {
        "model_loading_config": {
            "model_id": args.get("model_id", MODEL_ID),
            "model_source": args.get("model_source") or args.get("model_id", MODEL_ID),
        },
        "engine_kwargs": {"max_model_len": int(args.get("max_model_len", MAX_MODEL_LEN))},
        "deployment_config": {"num_replicas": int(args.get("num_replicas", 1))},
    }
    accelerator = args.get("accelerator_config")
    if not isinstance(accelerator, dict) or accelerator.get("kind") != "tpu":
        raise AppArgsError(
            "accelerator_config",
            accelerator,
            'give {"kind": "tpu", "topology": "<the slice shape>"} (the render derives it on a multi-host slice)',
        )
    if not str(args.get("accelerator_type", "")).startswith("TPU-"):
        raise AppArgsError("accelerator_type", args.get("accelerator_type"), 'give Ray\'s TPU type, e.g. "TPU-V6E"')
    chips = _chips(accelerator)
    per_host = args.get("chips_per_host")
    if per_host is not None:
        _check_hosts(args["accelerator_type"], str(accelerator["topology"]), int(per_host))
    # Each replica reserves the whole slice (slice_placement_group) and shards the model over all of it.
    config["engine_kwargs"]["tensor_parallel_size"] = chips
    return {**config, "accelerator_type": args["accelerator_type"], "accelerator_config": dict(accelerator)}


def build_app(args: dict[str, Any]) -> Application:
    """The Serve app builder (``import_path: seed_serve_llm.app:build_app``)."""
    from ray.serve.llm import LLMConfig, build_openai_app

    return build_openai_app({"llm_configs": [LLMConfig(**llm_config(args))]})
