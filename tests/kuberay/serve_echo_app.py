"""A one-deployment Ray Serve app for the end-to-end KubeRay stand-in test (imported by Serve replicas)."""

from __future__ import annotations

from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Echo:
    async def __call__(self, request: object) -> str:
        return "tpuflow-serve-ok"


app = Echo.bind()
