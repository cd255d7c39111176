"""A Ray Serve LLM app (tpuflow.serve.llm: its serve config and vLLM pod fields) as a RayService on the
template's slice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuflow.kuberay import DEFAULT_UPGRADE_STRATEGY
from tpuflow.kuberay.manifests import rayservice_manifest, spec_hash
from tpuflow.labels import SPEC_HASH_ANNOTATION
from tpuflow.serve.llm import LlmServe, add_vllm_pod_fields, llm_serve_config


def llm_rayservice_manifest(
    template: Any,
    llm: LlmServe,
    *,
    name: str,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    upgrade_strategy: str | None = None,
    pod_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A RayService running Ray Serve LLM on the template's slice (template: a RayClusterTemplate)."""
    manifest = rayservice_manifest(
        template,
        llm_serve_config(template.tpu, llm),
        name=name,
        namespace=namespace,
        labels=labels,
        annotations=annotations,
        upgrade_strategy=upgrade_strategy or DEFAULT_UPGRADE_STRATEGY,
        pod_labels=pod_labels,
    )
    add_vllm_pod_fields(manifest["spec"]["rayClusterConfig"], llm)
    # The hash records what is sent: recompute it over the finished spec.
    manifest["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = spec_hash(manifest["spec"])
    return manifest
