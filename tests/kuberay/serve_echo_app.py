"""A one-deployment Ray Serve app for the end-to-end KubeRay stand-in test (imported by Serve replicas)."""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Echo:
    async def __call__(self, request: object) -> str:
        return "tpuflow-serve-ok"


def app(args: dict[str, Any]) -> Application:
    """An application builder: a multi-host slice's apps carry its accelerator_type and accelerator_config."""
    return Echo.bind()
