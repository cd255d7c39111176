"""OpenAI-compatible completions for the addition model, as a Ray Serve application.

Import path "addition.serve_app:app_builder", args:
    {"checkpoint": PATH, "framework": "jax"|"torch", "model_name": "...",
     "backend": "numpy"|"jax"|"torch" (default numpy), "num_replicas": 1, "num_cpus": 0.25}

Routes (under the application's route_prefix): GET /v1/models, GET /v1/models/{id},
POST /v1/completions. The forward pass runs in-process with numpy by default, so a replica
starts without importing jax or torch. Temperature defaults to 0 (greedy), not OpenAI's 1:
an addition has one right answer.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from addition.data import TokenizeError
from addition.inference import BACKENDS
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

FRAMEWORKS = ("jax", "torch")
_ARGS = {"checkpoint", "framework", "model_name", "backend", "num_replicas", "num_cpus"}


class CompletionRequest(BaseModel):
    # Clients send fields this server ignores (top_p, user, ...); a field named "model"
    # needs pydantic's protected "model_" namespace switched off.
    model_config = ConfigDict(extra="allow", protected_namespaces=())

    model: str
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    echo: bool = False
    stream: bool = False


def _error(status: int, message: str, err_type: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    """The error body OpenAI clients parse into APIError subclasses."""
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": err_type, "param": param, "code": code}}
    )


def _apply_stop(text: str, stop: str | list[str] | None) -> tuple[str, bool]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


app = FastAPI(title="tpuflow addition completions")


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

    @app.get("/v1/models")
    def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._model_card()]}

    @app.get("/v1/models/{model_id}")
    def get_model(self, model_id: str) -> Any:
        if model_id != self.model_name:
            return _error(
                404, f"The model '{model_id}' does not exist", "invalid_request_error", "model", "model_not_found"
            )
        return self._model_card()

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "tpuflow"}

    @app.post("/v1/completions")
    def completions(self, req: CompletionRequest) -> Any:
        if req.model != self.model_name:
            return _error(404, f"The model '{req.model}' does not exist; this server has '{self.model_name}'",
                          "invalid_request_error", "model", "model_not_found")  # fmt: skip
        if req.stream:
            return _error(400, "stream=true is not supported", "invalid_request_error", "stream")
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts:
            return _error(400, "prompt must not be empty", "invalid_request_error", "prompt")
        temperature = req.temperature or 0.0
        rng = np.random.default_rng(req.seed)
        try:
            outs = self.predictor.complete(
                [p for p in prompts for _ in range(req.n)],
                max_new_tokens=req.max_tokens,
                temperature=temperature,
                rng=rng,
            )
        except TokenizeError as exc:
            return _error(400, str(exc), "invalid_request_error", "prompt")
        choices, completion_tokens = [], 0
        for i, out in enumerate(outs):
            text, stopped = _apply_stop(out.text, req.stop)
            completion_tokens += out.num_tokens
            prompt = prompts[i // req.n]
            choices.append({
                "text": prompt + text if req.echo else text,
                "index": i,
                "finish_reason": "stop" if stopped else out.finish_reason,
                "logprobs": None,
            })  # fmt: skip
        prompt_tokens = sum(len(p) for p in prompts)  # one token per character
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


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
