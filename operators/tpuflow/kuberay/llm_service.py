"""A Ray Serve LLM app (tpuflow.serve.llm: its serve config and vLLM pod fields) as a RayService on the
template's slice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Required, TypedDict, Unpack

from tpuflow.kuberay import DEFAULT_UPGRADE_STRATEGY
from tpuflow.kuberay.manifests import rayservice_manifest, spec_hash
from tpuflow.labels import SPEC_HASH_ANNOTATION
from tpuflow.serve.llm import LlmServe, add_vllm_pod_fields, llm_serve_config


class _RayServiceFields(TypedDict, total=False):
    """rayservice_manifest's keyword arguments, past upgrade_strategy (its docstring says what each is)."""

    name: Required[str]
    namespace: str
    labels: Mapping[str, str] | None
    annotations: Mapping[str, str] | None
    pod_labels: Mapping[str, str] | None


def llm_rayservice_manifest(
    template: Any, llm: LlmServe, *, upgrade_strategy: str | None = None, **fields: Unpack[_RayServiceFields]
) -> dict[str, Any]:
    """A RayService running Ray Serve LLM on the template's slice (template: a RayClusterTemplate); ``fields`` and
    ``upgrade_strategy`` (None: the default) as rayservice_manifest takes them."""
    manifest = rayservice_manifest(
        template,
        llm_serve_config(template.tpu, llm),
        upgrade_strategy=upgrade_strategy or DEFAULT_UPGRADE_STRATEGY,
        **fields,
    )
    add_vllm_pod_fields(manifest["spec"]["rayClusterConfig"], llm)
    # The hash records what is sent: recompute it over the finished spec.
    manifest["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = spec_hash(manifest["spec"])
    return manifest
