"""OpenAI-compatible completions for the addition model, as a Ray Serve application.

Import path "addition.serve_app:app_builder", args:
    {"checkpoint": PATH, "framework": "jax"|"torch", "model_name": "...",
     "backend": "numpy"|"jax"|"torch" (default numpy), "num_replicas": 1, "num_cpus": 0.25}

Routes (under the application's route_prefix): GET /v1/models, GET /v1/models/{id},
POST /v1/completions, POST /v1/chat/completions (streaming, usage and errors: addition.openai_api;
request limits from the deployment's user_config). The forward pass runs in-process with numpy by
default, so a replica starts without importing jax or torch. Temperature defaults to 0 (greedy), not OpenAI's 1:
an addition has one right answer.
"""

from __future__ import annotations

import time
from typing import Any

from addition.inference import BACKENDS
from addition.openai_api import ChatCompletionRequest, CompletionRequest, Limits, OpenAIService, install_error_handlers
from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve

FRAMEWORKS = ("jax", "torch")
_ARGS = {"checkpoint", "framework", "model_name", "backend", "num_replicas", "num_cpus"}
__all__ = ["ChatCompletionRequest", "CompletionRequest", "app_builder"]


app = FastAPI(title="tpuflow addition completions")
install_error_handlers(app)


@serve.deployment(max_ongoing_requests=64)
@serve.ingress(app)
class AdditionCompletions:
    def __init__(self, checkpoint: str, framework: str, model_name: str, backend: str = "numpy"):
        from addition.checkpoint import load_meta, local_copy
        from addition.inference import Predictor

        with local_copy(checkpoint) as d:
            meta = load_meta(d)
            if meta.framework != framework:
                raise ValueError(f"{checkpoint} was trained with {meta.framework}, not {framework}")
            self.predictor = Predictor.from_checkpoint(d, backend=backend)
        self.model_name = model_name
        self.created = int(time.time())

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's user_config: this replica's request limits (openai_api.Limits)."""
        self._openai_service = OpenAIService(
            self.predictor.complete, self.model_name, self.created, Limits.from_user_config(user_config)
        )

    def _openai(self) -> OpenAIService:
        if getattr(self, "_openai_service", None) is None:
            self._openai_service = OpenAIService(self.predictor.complete, self.model_name, self.created)
        return self._openai_service

    @app.get("/v1/models")
    def list_models(self) -> dict[str, Any]:
        return self._openai().list_models()

    @app.get("/v1/models/{model_id}")
    def get_model(self, model_id: str) -> Response:
        return self._openai().get_model(model_id)

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._openai().completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self._openai().chat_completions(request)


def app_builder(args: dict[str, Any]) -> Any:
    """Serve application builder; raises on missing or unknown args (Serve would drop unknown ones silently)."""
    unknown = sorted(set(args) - _ARGS)
    if unknown:
        raise ValueError(f"unknown args {unknown}; known: {sorted(_ARGS)}")
    if not args.get("checkpoint"):
        raise ValueError("args.checkpoint is required (checkpoint directory, local or gs://...)")
    framework = args.get("framework", "")
    if framework not in FRAMEWORKS:
        raise ValueError(f"args.framework must be one of {FRAMEWORKS}, got {framework!r}")
    backend = args.get("backend", "numpy")
    if backend not in BACKENDS:
        raise ValueError(f"args.backend must be one of {BACKENDS}, got {backend!r}")
    from tpuflow_driver.storage import normalize

    deployment = AdditionCompletions.options(
        num_replicas=int(args.get("num_replicas", 1)),
        ray_actor_options={"num_cpus": float(args.get("num_cpus", 0.25))},
    )
    return deployment.bind(
        normalize(str(args["checkpoint"])), framework, str(args.get("model_name") or f"addition-{framework}"), backend
    )
