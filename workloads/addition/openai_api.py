"""The OpenAI protocol around one completion function: request models, errors, usage, SSE streaming.

`OpenAIService` holds the HTTP logic of the Serve ingress (addition.serve_app), so it runs and is
tested in-process (FastAPI's TestClient against `build_app`) without Ray. It calls
`complete(prompts, max_new_tokens=..., temperature=..., rng=...) -> [Completion]` (the Predictor's).

Wire format, as the official `openai` client consumes it:
- `stream=true`: `text/event-stream`, one `data: {json}\\n\\n` event per chunk, then `data: [DONE]\\n\\n`;
  with `stream_options.include_usage` every chunk carries `"usage": null` and one last chunk with
  `"choices": []` carries the usage. The forward pass decodes the whole (short) answer at once, so
  the chunks (one per token) are sent once it is done.
- `/v1/chat/completions`: the prompt is the last user message (a missing trailing "=" is added);
  earlier messages are ignored, as the model has no context beyond one sum.
- Errors: `{"error": {"message", "type", "param", "code"}}` for every refused request: unknown model
  404, bad body or limits 400 (pydantic errors too, never FastAPI's 422), too many requests on this
  replica 429, model busy past the deadline 503, deadline passed mid-request 504; 429/503 carry
  Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
from addition.data import TokenizeError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

Complete = Callable[..., Sequence[Any]]
MAX_PROMPTS = 1024  # prompts x n in one request


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class _Request(BaseModel):
    # Clients send fields this server ignores (top_p, user, ...); a field named "model"
    # needs pydantic's protected "model_" namespace switched off.
    model_config = ConfigDict(extra="allow", protected_namespaces=())

    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None


class CompletionRequest(_Request):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=0)
    echo: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)


class APIError(Exception):
    """A refused request, sent as OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        err_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param, self.code = status, message, err_type, param, code
        self.retry_after = retry_after

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(max(1, round(self.retry_after)))} if self.retry_after is not None else None
        return error_response(self.status, self.message, self.err_type, self.param, self.code, headers=headers)


def error_response(
    status: int,
    message: str,
    err_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The error body OpenAI clients parse into APIError subclasses."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return JSONResponse(status_code=status, content=body, headers=headers)


# pydantic puts the union member or model tried into an error's location ("prompt.list[str].0"); OpenAI's
# param names the request field only.
_TYPE_IN_LOC = re.compile(r"^([a-z_-]+\[.*\]|str|int|float|bool|none|list|dict|[A-Z]\w*)$")


def _validation_error(err: ValidationError | RequestValidationError) -> APIError:
    first = err.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _TYPE_IN_LOC.match(str(p))]
    param = ".".join(loc) or None
    return APIError(400, f"{param or 'body'}: {first.get('msg')}", param=param, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    """OpenAI-shaped bodies for FastAPI's own refusals (422 validation -> 400, unknown route, method)."""

    async def on_validation(_: Request, err: Exception) -> Response:
        assert isinstance(err, RequestValidationError)
        return _validation_error(err).response()

    async def on_http(_: Request, err: Exception) -> Response:
        assert isinstance(err, StarletteHTTPException)
        code = "not_found" if err.status_code == 404 else None
        return error_response(err.status_code, str(err.detail), param=None, code=code, headers=err.headers)

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


@dataclass(frozen=True)
class Limits:
    """Per-replica request limits (the Serve deployment's user_config; tpuflow.serve.deployment_options).

    request_timeout_s: a request not answered by then fails (503 if its forward pass never started,
    504 if it did). max_inflight_requests: requests admitted at once on this replica, more get 429.
    max_concurrent_forward: forward passes at once (the others wait their turn). None: no limit.
    """

    request_timeout_s: float | None = None
    max_inflight_requests: int | None = None
    max_concurrent_forward: int | None = None
    retry_after_s: float = 1.0

    @classmethod
    def from_user_config(cls, config: dict[str, Any] | None) -> Limits:
        config = dict(config or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown user_config keys {unknown}; known: {sorted(known)}")
        for key in ("request_timeout_s", "retry_after_s"):
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise ValueError(f"user_config.{key} must be a positive number of seconds, got {value!r}")
        for key in ("max_inflight_requests", "max_concurrent_forward"):
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"user_config.{key} must be a whole number >= 1, got {value!r}")
        return cls(**config)


@dataclass(frozen=True)
class _Job:
    """One validated request, ready for the forward pass."""

    prompts: list[str]
    n: int
    max_tokens: int | None
    temperature: float
    seed: int | None
    stop: str | list[str] | None


@dataclass(frozen=True)
class _Choice:
    index: int
    prompt: str
    text: str
    finish_reason: str


def apply_stop(text: str, stop: str | list[str] | None) -> tuple[str, bool]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    """The addition prompt of a chat: the last user message, with its "=" ("17+25" -> "17+25=")."""
    users = [m for m in messages if m.role == "user"]
    if not users:
        raise APIError(400, "messages must contain a user message with the sum, e.g. '17+25='", param="messages")
    text = users[-1].text().strip()
    return text if text.endswith("=") else f"{text}="


class OpenAIService:
    """The routes' logic for one model: validate, run `complete` under the limits, shape the answer."""

    def __init__(self, complete: Complete, model_name: str, created: int, limits: Limits | None = None) -> None:
        self.complete, self.model_name, self.created = complete, model_name, created
        self.limits = limits or Limits()
        self._inflight = 0
        self._slots = asyncio.Semaphore(self.limits.max_concurrent_forward or 1)

    # --- models ---
    def model_card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "tpuflow"}

    def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card()]}

    def get_model(self, model_id: str) -> Response:
        if model_id != self.model_name:
            return APIError(
                404, f"The model '{model_id}' does not exist", param="model", code="model_not_found"
            ).response()
        return JSONResponse(self.model_card())

    # --- completions ---
    async def completions(self, request: Request) -> Response:
        try:
            req = await self._parse(request, CompletionRequest)
            assert isinstance(req, CompletionRequest)
            prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
            if not prompts:
                raise APIError(400, "prompt must not be empty", param="prompt")
            job = self._job(req, prompts, req.max_tokens, "prompt")
            choices, usage = await self._run(job, "prompt")
        except APIError as err:
            return err.response()
        return self._completion_response(req, choices, usage)

    async def chat_completions(self, request: Request) -> Response:
        try:
            req = await self._parse(request, ChatCompletionRequest)
            assert isinstance(req, ChatCompletionRequest)
            limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
            job = self._job(req, [chat_prompt(req.messages)], limit, "messages")
            choices, usage = await self._run(job, "messages")
        except APIError as err:
            return err.response()
        return self._chat_response(req, choices, usage)

    async def _parse(self, request: Request, model: type[_Request]) -> _Request:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise APIError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object", code="invalid_json")
        try:
            req = model.model_validate(body)
        except ValidationError as err:
            raise _validation_error(err) from None
        if req.model != self.model_name:
            raise APIError(
                404,
                f"The model '{req.model}' does not exist; this server has '{self.model_name}'",
                param="model",
                code="model_not_found",
            )
        return req

    def _job(self, req: _Request, prompts: list[str], max_tokens: int | None, param: str) -> _Job:
        if len(prompts) * req.n > MAX_PROMPTS:
            raise APIError(
                400, f"{len(prompts)} prompts x n={req.n} exceeds {MAX_PROMPTS} completions per request", param=param
            )
        return _Job(prompts, req.n, max_tokens, req.temperature or 0.0, req.seed, req.stop)

    async def _run(self, job: _Job, param: str) -> tuple[list[_Choice], dict[str, int]]:
        """The forward pass in a thread, within this replica's limits and the request's deadline."""
        limits = self.limits
        if limits.max_inflight_requests is not None and self._inflight >= limits.max_inflight_requests:
            raise APIError(
                429,
                f"this replica is at its limit of {limits.max_inflight_requests} requests in flight; retry shortly",
                err_type="rate_limit_error",
                code="rate_limit_exceeded",
                retry_after=limits.retry_after_s,
            )
        loop = asyncio.get_running_loop()
        deadline = None if limits.request_timeout_s is None else loop.time() + limits.request_timeout_s
        self._inflight += 1
        try:
            if limits.max_concurrent_forward is not None:
                try:
                    await asyncio.wait_for(self._slots.acquire(), _remaining(loop, deadline))
                except TimeoutError:
                    raise APIError(
                        503,
                        f"the model stayed busy for the whole request timeout ({limits.request_timeout_s}s); "
                        "retry shortly",
                        err_type="server_error",
                        code="overloaded",
                        retry_after=limits.retry_after_s,
                    ) from None
            work = asyncio.ensure_future(asyncio.to_thread(self._forward, job))
            if limits.max_concurrent_forward is not None:
                # The slot is free when the thread is done, not when a timed-out request gives up on it.
                work.add_done_callback(lambda _: self._slots.release())
            try:
                outs = await asyncio.wait_for(asyncio.shield(work), _remaining(loop, deadline))
            except TimeoutError:
                raise APIError(
                    504,
                    f"the request did not finish within its timeout of {limits.request_timeout_s}s",
                    err_type="timeout_error",
                    code="request_timeout",
                ) from None
            except TokenizeError as err:
                raise APIError(400, str(err), param=param, code="invalid_prompt") from None
        finally:
            self._inflight -= 1
        choices = []
        for i, out in enumerate(outs):
            text, stopped = apply_stop(out.text, job.stop)
            reason = "stop" if stopped else out.finish_reason
            choices.append(_Choice(i, job.prompts[i // job.n], text, reason))
        return choices, _usage(job.prompts, outs)

    def _forward(self, job: _Job) -> Sequence[Any]:
        return self.complete(
            [p for p in job.prompts for _ in range(job.n)],
            max_new_tokens=job.max_tokens,
            temperature=job.temperature,
            rng=np.random.default_rng(job.seed),
        )

    # --- responses ---
    def _completion_response(self, req: CompletionRequest, choices: list[_Choice], usage: dict[str, int]) -> Response:
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": cid, "object": "text_completion", "created": created, "model": self.model_name}
        if req.stream:
            return sse(_completion_chunks(head, choices, req.echo, usage, _include_usage(req)))
        body = {
            **head,
            "choices": [
                {
                    "text": c.prompt + c.text if req.echo else c.text,
                    "index": c.index,
                    "finish_reason": c.finish_reason,
                    "logprobs": None,
                }
                for c in choices
            ],
            "usage": usage,
        }
        return JSONResponse(body)

    def _chat_response(self, req: ChatCompletionRequest, choices: list[_Choice], usage: dict[str, int]) -> Response:
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.model_name}
            return sse(_chat_chunks(head, choices, usage, _include_usage(req)))
        body = {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": self.model_name,
            "choices": [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason,
                    "logprobs": None,
                }
                for c in choices
            ],
            "usage": usage,
        }
        return JSONResponse(body)


def _usage(prompts: Sequence[str], outs: Sequence[Any]) -> dict[str, int]:
    prompt_tokens = sum(len(p) for p in prompts)  # one token per character, counted once however large n is
    completion_tokens = sum(int(o.num_tokens) for o in outs)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


def _remaining(loop: asyncio.AbstractEventLoop, deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - loop.time())


def _include_usage(req: _Request) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _tokens(text: str) -> list[str]:
    return list(text)  # one token per character, as the model reads and writes


def _completion_chunks(
    head: dict[str, Any], choices: list[_Choice], echo: bool, usage: dict[str, int], include_usage: bool
) -> Iterable[dict[str, Any]]:
    extra = {"usage": None} if include_usage else {}
    for c in choices:
        pieces = _tokens(c.text)
        if echo:
            pieces = [c.prompt + (pieces[0] if pieces else ""), *pieces[1:]]
        for piece in pieces:
            yield {**head, "choices": [{"text": piece, "index": c.index, "finish_reason": None, "logprobs": None}],
                   **extra}  # fmt: skip
        yield {**head, "choices": [{"text": "", "index": c.index, "finish_reason": c.finish_reason, "logprobs": None}],
               **extra}  # fmt: skip
    if include_usage:
        yield {**head, "choices": [], "usage": usage}


def _chat_chunks(
    head: dict[str, Any], choices: list[_Choice], usage: dict[str, int], include_usage: bool
) -> Iterable[dict[str, Any]]:
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        return {**head, "choices": [choice], **extra}

    for c in choices:
        yield chunk(c.index, {"role": "assistant", "content": ""}, None)
        for piece in _tokens(c.text):
            yield chunk(c.index, {"content": piece}, None)
        yield chunk(c.index, {}, c.finish_reason)
    if include_usage:
        yield {**head, "choices": [], "usage": usage}


def sse(chunks: Iterable[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events as OpenAI sends them: `data: {json}` events, then `data: [DONE]`."""

    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def build_app(service: OpenAIService) -> FastAPI:
    """The same routes as the Serve ingress, bound to one service: for in-process use and tests."""
    app = FastAPI(title=f"tpuflow {service.model_name}")
    install_error_handlers(app)
    app.add_api_route("/v1/models", service.list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id}", service.get_model, methods=["GET"])
    app.add_api_route("/v1/completions", service.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", service.chat_completions, methods=["POST"])
    return app
