"""OpenAI-compatible completions for the addition model, as a Ray Serve application.

Import path "addition.serve_app:app_builder", args:
    {"checkpoint": PATH, "framework": "jax"|"torch", "model_name": "...",
     "backend": "numpy"|"jax"|"torch" (default: the framework the model was trained with),
     "num_replicas": 1, "num_cpus": 0.25,
     "accelerator_type": "TPU-V6E", "accelerator_config": {"kind": "tpu", "topology": "4x4"},
     "chips_per_host": 4, "tpu_resource_per_chip": 1, "num_devices": N,
     "token_sha256": "<hex SHA-256 of the bearer token>"}

Without accelerator_type a replica is a CPU actor. With it, on a single-host slice the replica holds
its host's TPU (TPU: chips per host plus the accelerator_type resource) and runs the forward pass in
process; on a multi-host slice it requests no TPU, is pinned to a TPU host by label, and reserves a
whole slice at start-up (addition.slice_serving: one worker per host, one JAX mesh). A multi-host
config without accelerator_config.topology gets Serve-made per-chip bundles (num_devices of them),
Ray Serve LLM's fallback, which can straddle two slices and hang: tpuflow's deploy checks reject it.

Routes (under the application's route_prefix): GET /v1/models, GET /v1/models/{id},
POST /v1/completions, POST /v1/chat/completions (streaming, usage and errors: addition.openai_api;
request limits from the deployment's user_config). `stream=true` sends each token as the decode step
that wrote it returns, on a single-host replica and on a multi-host one alike (addition.slice_serving).
Request batching (the same user_config's `max_batch_size`, `batch_wait_timeout_s`; tpuflow's
deployment_options["user_config"], checked by pipeline.check_user_config): concurrent non-streaming greedy completions share one forward call through Ray
Serve's `@serve.batch` (openai_api.forward_batch). Without `max_batch_size` it is on (32) for a
multi-host replica and off otherwise, as measured (MULTI_HOST_MAX_BATCH_SIZE); `max_batch_size: 1`
switches it off. Off, every request runs its own forward.
Temperature defaults to 0 (greedy), not OpenAI's 1: an addition has one right answer.
With args.token_sha256 every route answers 401 unless the request carries ``Authorization: Bearer <token>``
whose SHA-256 is that digest (tpuflow_driver.endpoint_token; the args never hold the token itself).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from addition.inference import BACKENDS
from addition.openai_api import ChatCompletionRequest, CompletionRequest, Limits, OpenAIService, install_error_handlers
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from ray import serve
from tpuflow_driver.endpoint_token import ARG as TOKEN_ARG
from tpuflow_driver.endpoint_token import CHALLENGE, authorized, checked_digest

FRAMEWORKS = ("jax", "torch")
_ARGS = {
    "checkpoint",
    "framework",
    "model_name",
    "backend",
    "num_replicas",
    "num_cpus",
    "accelerator_type",
    "accelerator_config",
    "chips_per_host",
    "tpu_resource_per_chip",
    "num_devices",
    TOKEN_ARG,
}
__all__ = ["ChatCompletionRequest", "CompletionRequest", "app_builder"]
ACCELERATOR_LABEL = "ray.io/accelerator-type"
# A lost host must fail the multi-host replica's health check quickly, so Serve replaces it.
SLICE_HEALTH_CHECK = {"health_check_period_s": 2.0, "health_check_timeout_s": 30.0}
# Request batching where the user_config does not set max_batch_size, as measured side by side
# (bench/README.md, serve_batched_rps_32): on for a multi-host replica, whose slice runs one request at
# a time (1.5-1.7x the requests/s at 8 clients, 2.4-2.7x at 32, one-client p50 within noise); off for
# CPU and single-host replicas (no gain at 8 clients on a CPU replica, a possible one-client cost).
MULTI_HOST_MAX_BATCH_SIZE = 32


# No docs routes: they would answer 200 without the bearer token, and a kept endpoint's idle watch counts 2xx
# answers as use (tpuflow.serve.idle), so anyone could keep it.
app = FastAPI(title="tpuflow addition completions", docs_url=None, redoc_url=None, openapi_url=None)
install_error_handlers(app)


def _multi_host(tpu: dict[str, Any]) -> bool:
    topology = tpu.get("topology")
    chips = math.prod(int(d) for d in topology.split("x")) if topology else int(tpu.get("num_devices") or 0)
    return chips > int(tpu["chips_per_host"])


def _warm_batch_sizes(complete: Any, max_batch_size: int) -> None:
    """Run each batch size batching can bring (openai_api.forward_batch pads a batch to a power of two
    rows) once, so that a jitted forward compiles them now rather than stalling live requests."""
    size = 2
    while size < 2 * max_batch_size:
        complete(["0+0="] * size, max_new_tokens=1)  # one decode step: the forward of that shape
        size *= 2


# Above the deployment: @serve.deployment pickles the class (with the globals its methods use) when
# the class is defined, so a helper defined further down is missing in the replica.
@serve.deployment(max_ongoing_requests=64)
@serve.ingress(app)
class AdditionCompletions:
    def __init__(
        self,
        checkpoint: str,
        framework: str,
        model_name: str,
        backend: str | None = None,
        tpu: dict[str, Any] | None = None,
        token_sha256: str | None = None,
    ):
        from addition.checkpoint import load_meta, load_params, local_copy
        from addition.inference import Predictor

        self.predictor: Any = None
        self.token_sha256 = checked_digest(token_sha256)
        self.default_max_batch_size = MULTI_HOST_MAX_BATCH_SIZE if tpu and _multi_host(tpu) else None
        with local_copy(checkpoint) as d:
            meta = load_meta(d)
            if meta.framework != framework:
                raise ValueError(f"{checkpoint} was trained with {meta.framework}, not {framework}")
            if tpu and _multi_host(tpu):
                from addition.slice_serving import SlicePredictor, SliceShape

                self.predictor = SlicePredictor(load_params(d, meta.model), meta, SliceShape(**tpu))
            else:
                self.predictor = Predictor.from_checkpoint(d, backend=backend or framework)
        self.model_name = model_name
        self.created = int(time.time())
        self._openai_service = self._service(self._limits(None))  # now: batching's warm-up before any request

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's user_config: this replica's request limits and batching (openai_api.Limits)."""
        self._openai_service = self._service(self._limits(user_config))

    def _limits(self, user_config: dict[str, Any] | None) -> Limits:
        limits = Limits.from_user_config(user_config)
        if limits.max_batch_size is None and self.default_max_batch_size:
            limits = replace(limits, max_batch_size=self.default_max_batch_size)
        return limits

    def _openai(self) -> OpenAIService:
        if getattr(self, "_openai_service", None) is None:
            self._openai_service = self._service(self._limits(None))
        return self._openai_service

    def _service(self, limits: Limits) -> OpenAIService:
        # With batching on, the batch sizes it brings are compiled first (the replica is ready after).
        # stream: one decode step at a time, so a streamed answer leaves this replica token by token
        # (the FastAPI StreamingResponse goes through Serve's proxy as it is produced).
        # batch: Ray Serve's own batching decorator, used only when the limits switch batching on.
        if limits.batching:
            assert limits.max_batch_size is not None
            _warm_batch_sizes(self.predictor.complete, limits.max_batch_size)
        p = self.predictor
        return OpenAIService(p.complete, self.model_name, self.created, limits, stream=p.stream, batch=serve.batch)

    def check_health(self) -> None:
        """Serve calls this periodically: a multi-host replica is unhealthy once a host's worker is gone."""
        check = getattr(self.predictor, "check_health", None)
        if check is not None:
            check()

    def __del__(self) -> None:
        """Serve calls this when it stops the replica: release the slice it reserved."""
        shutdown = getattr(getattr(self, "predictor", None), "shutdown", None)
        if shutdown is not None:
            shutdown()

    def _authorize(self, request: Request) -> None:
        """401 unless the request's bearer token matches args.token_sha256 (no digest: every request passes)."""
        if not authorized(request.headers.get("authorization"), self.token_sha256):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token", headers=CHALLENGE)

    @app.get("/v1/models")
    def list_models(self, request: Request) -> dict[str, Any]:
        self._authorize(request)
        return self._openai().list_models()

    @app.get("/v1/models/{model_id}")
    def get_model(self, model_id: str, request: Request) -> Response:
        self._authorize(request)
        return self._openai().get_model(model_id)

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        self._authorize(request)
        return await self._openai().completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        self._authorize(request)
        return await self._openai().chat_completions(request)


def _tpu_args(args: dict[str, Any]) -> dict[str, Any] | None:
    """The replica's TPU placement from the args (None: a CPU replica); ValueError on a bad combination."""
    accel = args.get("accelerator_type")
    config = args.get("accelerator_config")
    if not accel:
        if config:
            raise ValueError("args.accelerator_config needs args.accelerator_type (e.g. TPU-V6E)")
        return None
    if not isinstance(accel, str) or not accel.upper().startswith("TPU-"):
        raise ValueError(f"args.accelerator_type must be Ray's TPU type such as TPU-V6E, got {accel!r}")
    config = config or {"kind": "tpu"}
    if not isinstance(config, dict) or config.get("kind") != "tpu" or set(config) - {"kind", "topology"}:
        raise ValueError(f'args.accelerator_config must be {{"kind": "tpu", "topology": "AxB"}}, got {config!r}')
    chips_per_host = args.get("chips_per_host")
    if not isinstance(chips_per_host, int) or isinstance(chips_per_host, bool) or chips_per_host < 1:
        raise ValueError(f"args.chips_per_host must be the TPU chips of one host, got {chips_per_host!r}")
    per_chip = args.get("tpu_resource_per_chip", 1)
    topology = config.get("topology")
    num_devices = args.get("num_devices")
    if not topology and not num_devices:
        raise ValueError("a TPU replica needs args.accelerator_config.topology (or num_devices for per-chip bundles)")
    return {
        "accelerator_type": accel.upper(),
        "topology": str(topology).lower() if topology else None,
        "chips_per_host": chips_per_host,
        "tpu_resource_per_chip": int(per_chip),
        "num_devices": int(num_devices) if num_devices else None,
    }


def _placement_options(tpu: dict[str, Any] | None, num_cpus: float) -> dict[str, Any]:
    """Deployment options that place a replica (see the module docstring)."""
    if tpu is None:
        return {"ray_actor_options": {"num_cpus": num_cpus}}
    accel = tpu["accelerator_type"]
    if not _multi_host(tpu):
        tpu_per_host = tpu["chips_per_host"] * tpu["tpu_resource_per_chip"]
        return {
            "ray_actor_options": {"num_cpus": num_cpus, "resources": {"TPU": tpu_per_host}, "accelerator_type": accel}
        }
    if tpu["topology"]:
        # Ray Serve LLM's TPUAccelerator with a topology: no placement group from Serve (the replica
        # reserves the slice itself) and no TPU on the replica; a label pins it to a TPU host.
        return {
            "ray_actor_options": {"num_cpus": num_cpus, "label_selector": {ACCELERATOR_LABEL: accel}},
            **SLICE_HEALTH_CHECK,
        }
    # No topology: one {"TPU": 1} bundle per chip, as Ray Serve LLM falls back to (bundle 0 holds the replica).
    chips = [{"TPU": 1, f"accelerator_type:{accel}": 0.001} for _ in range(int(tpu["num_devices"]))]
    return {
        "ray_actor_options": {"num_cpus": num_cpus},
        "placement_group_bundles": [{"CPU": num_cpus}, *chips],
        "placement_group_strategy": "PACK",
        **SLICE_HEALTH_CHECK,
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
    tpu = _tpu_args(args)
    multi_host = tpu is not None and _multi_host(tpu)
    # A multi-host replica is one JAX mesh over the slice whichever framework trained the (canonical) weights.
    backend = args.get("backend", "jax" if multi_host else framework)
    if backend not in BACKENDS:
        raise ValueError(f"args.backend must be one of {BACKENDS}, got {backend!r}")
    if multi_host and backend != "jax":
        raise ValueError(f"a multi-host replica runs one JAX mesh over the slice; args.backend {backend!r} cannot")
    from tpuflow_driver.storage import normalize

    token_sha256 = checked_digest(args.get(TOKEN_ARG))
    deployment = AdditionCompletions.options(
        num_replicas=int(args.get("num_replicas", 1)),
        **_placement_options(tpu, float(args.get("num_cpus", 0.25))),
    )
    return deployment.bind(
        normalize(str(args["checkpoint"])),
        framework,
        str(args.get("model_name") or f"addition-{framework}"),
        backend,
        tpu,
        token_sha256=token_sha256,
    )
