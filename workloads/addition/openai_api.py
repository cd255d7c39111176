"""The OpenAI protocol around one completion function: request models, errors, usage, SSE streaming.

`OpenAIService` holds the HTTP logic of the Serve ingress (addition.serve_app), so it runs and is
tested in-process (FastAPI's TestClient against `build_app`) without Ray. It calls
`complete(prompts, max_new_tokens=..., temperature=..., rng=...) -> [Completion]` (the Predictor's).

Wire format, as the official `openai` client consumes it:
- `stream=true`: `text/event-stream`, one `data: {json}\\n\\n` event per chunk, then `data: [DONE]\\n\\n`;
  with `stream_options.include_usage` every chunk carries `"usage": null` and one last chunk with
  `"choices": []` carries the usage. Given a `stream` function (the Predictor's: one decode step at a
  time, `addition.inference.generate_stream`), each step runs in a thread and its tokens are sent (one
  chunk per token) as soon as it returns; text that may be the start of a stop string is held back
  until the next tokens decide it. Choices' chunks interleave, step by step. Refusals before the
  stream starts are HTTP errors; a deadline passed (or the model failing) mid-stream ends the stream
  with an error event `data: {"error": {...}}` (what the official client raises), then `[DONE]`.
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
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import numpy as np
from addition.data import TokenizeError
from addition.inference import Step
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

Complete = Callable[..., Sequence[Any]]
StreamSteps = Callable[..., Iterator[Step]]
BatchFn = Callable[[list[Any]], Awaitable[list[Any]]]  # jobs -> a result (or its error) per job
MAX_PROMPTS = 1024  # prompts x n in one request
DEFAULT_BATCH_WAIT_S = 0.0  # Limits.batch_wait_timeout_s when batching is on and it is not given
logger = logging.getLogger(__name__)


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

    def body(self) -> dict[str, Any]:
        return _error_body(self.message, self.err_type, self.param, self.code)

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(max(1, round(self.retry_after)))} if self.retry_after is not None else None
        return JSONResponse(status_code=self.status, content=self.body(), headers=headers)


def _error_body(message: str, err_type: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    err_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The error body OpenAI clients parse into APIError subclasses."""
    return JSONResponse(status_code=status, content=_error_body(message, err_type, param, code), headers=headers)


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
    """Per-replica request limits (the Serve deployment's user_config; pipeline.check_user_config).

    request_timeout_s: a request not answered by then fails (503 if its forward pass never started,
    504 if it did). max_inflight_requests: requests admitted at once on this replica, more get 429.
    max_concurrent_forward: forward passes at once (the others wait their turn). None: no limit.
    max_batch_size / batch_wait_timeout_s: request batching (None or 1: off; addition.serve_app turns
    None into its default for the replica's kind). Concurrent non-streaming greedy requests are
    combined, up to max_batch_size requests, into one forward call by the service's `batch` decorator
    (Ray Serve's `@serve.batch` in the replica): the requests that arrive while a batch runs form the
    next batch together, and a batch waits batch_wait_timeout_s (default 0: no wait) after its first
    request for more; with max_concurrent_forward, each request holds its slot while it waits in or
    runs a batch.
    """

    request_timeout_s: float | None = None
    max_inflight_requests: int | None = None
    max_concurrent_forward: int | None = None
    retry_after_s: float = 1.0
    max_batch_size: int | None = None
    batch_wait_timeout_s: float | None = None

    @property
    def batching(self) -> bool:
        return (self.max_batch_size or 1) > 1

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
        for key in ("max_inflight_requests", "max_concurrent_forward", "max_batch_size"):
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"user_config.{key} must be a whole number >= 1, got {value!r}")
        wait = config.get("batch_wait_timeout_s")
        if wait is not None:
            if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < math.inf:
                raise ValueError(f"user_config.batch_wait_timeout_s must be a number of seconds >= 0, got {wait!r}")
            if config.get("max_batch_size") is None:
                raise ValueError("user_config.batch_wait_timeout_s needs max_batch_size (batching is off without it)")
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


def _stops(stop: str | list[str] | None) -> list[str]:
    return [s for s in ([stop] if isinstance(stop, str) else list(stop or [])) if s]


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop string in `text` begins (None: none there)."""
    return min((i for i in (text.find(s) for s in stops) if i >= 0), default=None)


def apply_stop(text: str, stop: str | list[str] | None) -> tuple[str, bool]:
    cut = _first_stop(text, _stops(stop))
    return (text[:cut], True) if cut is not None else (text, False)


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    """The addition prompt of a chat: the last user message, with its "=" ("17+25" -> "17+25=")."""
    users = [m for m in messages if m.role == "user"]
    if not users:
        raise APIError(400, "messages must contain a user message with the sum, e.g. '17+25='", param="messages")
    text = users[-1].text().strip()
    return text if text.endswith("=") else f"{text}="


class OpenAIService:
    """The routes' logic for one model: validate, run `complete` under the limits, shape the answer.

    `stream(prompts, <complete's keywords>) -> Iterator[Step]` (the Predictor's) makes `stream=true`
    send each token as soon as the decode step that wrote it returns. Without it a stream is the whole
    completion from `complete`, then sent as one chunk per token.

    `batch` is a batching decorator with `ray.serve.batch`'s signature (`batch(max_batch_size=...,
    batch_wait_timeout_s=...)(async fn(list) -> list)`): with it and `limits.max_batch_size` > 1,
    concurrent non-streaming greedy requests share one `complete` call (`forward_batch`). Streams and
    sampled requests (temperature > 0: their rng draws depend on the batch) always run alone.
    """

    def __init__(
        self,
        complete: Complete,
        model_name: str,
        created: int,
        limits: Limits | None = None,
        stream: StreamSteps | None = None,
        batch: Callable[..., Callable[[BatchFn], Callable[[_Job], Awaitable[Any]]]] | None = None,
    ) -> None:
        self.complete, self.model_name, self.created = complete, model_name, created
        self.stream: StreamSteps = stream or (lambda prompts, **kwargs: iter([Step.of(complete(prompts, **kwargs))]))
        self.limits = limits or Limits()
        self._inflight = 0
        self._slots = asyncio.Semaphore(self.limits.max_concurrent_forward or 1)
        self._batched: Callable[[_Job], Awaitable[Any]] | None = None
        # Batching (see _batched_forward): batches in their forward, requests waiting for them to end,
        # and whether none is.
        self._running = self._waiting = 0
        self._idle = asyncio.Event()
        self._idle.set()
        if batch is not None and self.limits.batching:
            wait = self.limits.batch_wait_timeout_s
            self._batched = batch(
                max_batch_size=self.limits.max_batch_size,
                batch_wait_timeout_s=DEFAULT_BATCH_WAIT_S if wait is None else wait,
            )(self._forward_batch)

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
            if req.stream:
                chunks = _CompletionChunks(self._head("cmpl", "text_completion"), job, _include_usage(req), req.echo)
                return await self._stream(job, "prompt", chunks)
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
            if req.stream:
                chunks = _ChatChunks(self._head("chatcmpl", "chat.completion.chunk"), job, _include_usage(req))
                return await self._stream(job, "messages", chunks)
            choices, usage = await self._run(job, "messages")
        except APIError as err:
            return err.response()
        return self._chat_response(choices, usage)

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

    # --- the replica's limits ---
    def _admit(self) -> float | None:
        """Count the request in flight (429 at the limit); returns its deadline on the loop's clock."""
        limits = self.limits
        if limits.max_inflight_requests is not None and self._inflight >= limits.max_inflight_requests:
            raise APIError(
                429,
                f"this replica is at its limit of {limits.max_inflight_requests} requests in flight; retry shortly",
                err_type="rate_limit_error",
                code="rate_limit_exceeded",
                retry_after=limits.retry_after_s,
            )
        self._inflight += 1
        timeout = limits.request_timeout_s
        return None if timeout is None else asyncio.get_running_loop().time() + timeout

    def _leave(self) -> None:
        self._inflight -= 1

    async def _take_slot(self, deadline: float | None) -> Callable[[], None]:
        """Wait for a forward slot (503 if the deadline passes first); returns what gives it back."""
        limits = self.limits
        if limits.max_concurrent_forward is None:
            return lambda: None
        try:
            await asyncio.wait_for(self._slots.acquire(), _remaining(deadline))
        except TimeoutError:
            raise APIError(
                503,
                f"the model stayed busy for the whole request timeout ({limits.request_timeout_s}s); retry shortly",
                err_type="server_error",
                code="overloaded",
                retry_after=limits.retry_after_s,
            ) from None
        return self._slots.release

    def _timed_out(self) -> APIError:
        return APIError(
            504,
            f"the request did not finish within its timeout of {self.limits.request_timeout_s}s",
            err_type="timeout_error",
            code="request_timeout",
        )

    async def _run(self, job: _Job, param: str) -> tuple[list[_Choice], dict[str, int]]:
        """The forward pass in a thread, within this replica's limits and the request's deadline."""
        deadline = self._admit()
        try:
            release = await self._take_slot(deadline)
            if self._batched is not None and job.temperature == 0:
                work = asyncio.ensure_future(self._batched_forward(job))
            else:
                work = asyncio.ensure_future(asyncio.to_thread(self._forward, job))
            # The slot is free when the thread is done, not when a timed-out request gives up on it.
            work.add_done_callback(lambda _: release())
            try:
                outs = await asyncio.wait_for(asyncio.shield(work), _remaining(deadline))
            except TimeoutError:
                raise self._timed_out() from None
            except TokenizeError as err:
                raise APIError(400, str(err), param=param, code="invalid_prompt") from None
        finally:
            self._leave()
        choices = []
        for i, out in enumerate(outs):
            text, stopped = apply_stop(out.text, job.stop)
            reason = "stop" if stopped else out.finish_reason
            choices.append(_Choice(i, job.prompts[i // job.n], text, reason))
        return choices, _usage(job.prompts, outs)

    def _forward(self, job: _Job) -> Sequence[Any]:
        return self.complete(_expanded(job), **_decode_kwargs(job))

    async def _batched_forward(self, job: _Job) -> Sequence[Any]:
        """This job's completions, from the batch it joins; its own error (only its own) raised here.

        A request that arrives while a batch's forward runs waits for it to end; then all such requests
        join the batcher's queue in the same turn of the event loop and form the next batch together.
        (Serve's batcher forms a batch from what is queued whether or not the previous one still runs:
        requests trickling in during a forward would otherwise each make a batch of one and queue
        behind it.) With the model idle, a request joins the queue at once.
        """
        assert self._batched is not None
        if not self._idle.is_set():
            self._waiting += 1
            try:
                await self._idle.wait()
            finally:
                self._waiting -= 1
        out = await self._batched(job)
        if isinstance(out, BaseException):
            raise out
        return out

    async def _forward_batch(self, jobs: list[_Job]) -> list[Sequence[Any] | Exception]:
        """One batch's forward in a thread, a result per job (what the batching decorator wraps)."""
        self._running += 1
        self._idle.clear()
        try:
            return await asyncio.to_thread(forward_batch, self.complete, jobs)
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    async def _stream(self, job: _Job, param: str, chunks: _Chunks) -> Response:
        """Admit the request and open its decode (refusals are still HTTP errors), then answer with an
        event stream whose chunks are sent as each decode step returns; past the deadline, the stream
        ends with an error event."""
        deadline = self._admit()
        decode = _Decode(on_close=self._leave)
        try:
            decode.release = await self._take_slot(deadline)
            try:
                await decode.open(lambda: self.stream(_expanded(job), **_decode_kwargs(job)), _remaining(deadline))
            except TimeoutError:
                raise self._timed_out() from None
            except TokenizeError as err:
                raise APIError(400, str(err), param=param, code="invalid_prompt") from None
        except BaseException:
            decode.close()
            raise
        return _EventStream(self._events(decode, deadline, chunks), on_close=decode.close)

    async def _events(self, decode: _Decode, deadline: float | None, chunks: _Chunks) -> AsyncIterator[bytes]:
        try:
            for chunk in chunks.start():
                yield _event(chunk)
            while True:
                try:
                    step = await decode.next(_remaining(deadline))
                except TimeoutError:
                    yield _event(self._timed_out().body())
                    break
                except Exception as err:  # the model failed after the response started: tell the client
                    logger.exception("decode step failed mid-stream")
                    failed = APIError(500, f"the model failed mid-stream: {err}", "server_error", code="internal_error")
                    yield _event(failed.body())
                    break
                if step is None:
                    for chunk in chunks.end():
                        yield _event(chunk)
                    break
                for chunk in chunks.step(step):
                    yield _event(chunk)
            yield b"data: [DONE]\n\n"
        finally:
            decode.close()

    # --- responses ---
    def _head(self, prefix: str, obj: str) -> dict[str, Any]:
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()),
                "model": self.model_name}  # fmt: skip

    def _completion_response(self, req: CompletionRequest, choices: list[_Choice], usage: dict[str, int]) -> Response:
        body = {
            **self._head("cmpl", "text_completion"),
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

    def _chat_response(self, choices: list[_Choice], usage: dict[str, int]) -> Response:
        body = {
            **self._head("chatcmpl", "chat.completion"),
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


def forward_batch(complete: Complete, jobs: Sequence[_Job]) -> list[Sequence[Any] | Exception]:
    """Greedy jobs' completions from one `complete` call, each job's as it would get them alone.

    Every job's prompts (times n) go in one batch, padded with copies of the last prompt to a power of
    two rows (a jitted forward compiles once per batch size: this bounds the sizes a replica compiles),
    decoded greedily to the largest token budget among the jobs (None, the model's whole answer, if
    any job has none), then each completion is cut to its own job's budget as `generate` cuts it (text
    only grows; eos counts as a token). Greedy rows do not depend on one another, so batching changes
    no answer. If the call fails (e.g. one prompt the tokenizer refuses), every job runs alone: each
    entry is then the job's completions or the exception that job alone raised.
    """
    if len(jobs) == 1:
        return [_forward_alone(complete, jobs[0])]
    budgets = [j.max_tokens for j in jobs]
    budget = None if any(b is None for b in budgets) else max(b for b in budgets if b is not None)
    prompts = [p for j in jobs for p in _expanded(j)]
    rows = len(prompts)
    padded = prompts + prompts[-1:] * ((1 << (rows - 1).bit_length()) - rows)
    try:
        outs = complete(padded, max_new_tokens=budget, temperature=0.0)
    except Exception:
        logger.info("a batch of %d requests failed; running each alone", len(jobs), exc_info=True)
        return [_forward_alone(complete, j) for j in jobs]
    results: list[Sequence[Any] | Exception] = []
    start = 0
    for job in jobs:
        count = len(job.prompts) * job.n
        results.append([_cut(o, job.max_tokens) for o in outs[start : start + count]])
        start += count
    return results


def _forward_alone(complete: Complete, job: _Job) -> Sequence[Any] | Exception:
    try:
        return complete(_expanded(job), **_decode_kwargs(job))
    except Exception as err:  # returned, not raised: it is this job's answer, not the batch's
        return err


def _cut(out: Any, limit: int | None) -> Any:
    """A completion decoded with a larger budget, as a decode with `limit` tokens would have ended it."""
    if limit is None or len(out.text) < limit:
        return out  # it ended (eos or the sequence's end) within the budget: the same either way
    return replace(out, text=out.text[:limit], finish_reason="length", num_tokens=limit)


def _expanded(job: _Job) -> list[str]:
    return [p for p in job.prompts for _ in range(job.n)]


def _decode_kwargs(job: _Job) -> dict[str, Any]:
    return {"max_new_tokens": job.max_tokens, "temperature": job.temperature, "rng": np.random.default_rng(job.seed)}


def _usage(prompts: Sequence[str], outs: Sequence[Any]) -> dict[str, int]:
    prompt_tokens = sum(len(p) for p in prompts)  # one token per character, counted once however large n is
    completion_tokens = sum(int(o.num_tokens) for o in outs)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())


def _include_usage(req: _Request) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _tokens(text: str) -> list[str]:
    return list(text)  # one token per character, as the model reads and writes


class _Decode:
    """One stream's decode: opening it and each of its steps run in a thread, one at a time.

    Closing it (idempotent; `on_close` runs then) closes the step iterator and gives the forward slot
    back (`release`) once no thread is running a step: a request that stopped waiting (timeout, client
    gone) does not free the model while its last step still runs.
    """

    def __init__(self, on_close: Callable[[], None]) -> None:
        self.release: Callable[[], None] = lambda: None
        self._on_close = on_close
        self._steps: Iterator[Step] | None = None
        self._work: asyncio.Future[Any] | None = None
        self._closed = False

    async def open(self, start: Callable[[], Iterator[Step]], timeout: float | None) -> None:
        def run() -> None:
            self._steps = start()  # kept even if the request stopped waiting, so that close closes it

        await self._call(run, timeout=timeout)

    async def next(self, timeout: float | None) -> Step | None:
        """The next decode step, None after the last; TimeoutError when `timeout` passes first."""
        assert self._steps is not None
        return await self._call(next, self._steps, None, timeout=timeout)

    async def _call(self, fn: Callable[..., Any], *args: Any, timeout: float | None) -> Any:
        self._work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        return await asyncio.wait_for(asyncio.shield(self._work), timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._on_close()
        if self._work is not None and not self._work.done():
            self._work.add_done_callback(lambda _: self._finish())
        else:
            self._finish()

    def _finish(self) -> None:
        try:
            if self._work is not None and not self._work.cancelled():
                self._work.exception()  # retrieved: an abandoned step's error is not worth a warning
            close = getattr(self._steps, "close", None)
            if close is not None:
                close()
        finally:
            self.release()


class _StopText:
    """One choice's text as it streams in, cut where `apply_stop` cuts the whole text: what could still
    turn out to be (the start of) a stop string is held back until the next tokens decide it."""

    def __init__(self, stop: str | list[str] | None) -> None:
        self.stops = _stops(stop)
        self.text, self.sent, self.stopped = "", 0, False

    def feed(self, delta: str) -> str:
        """The text that can be sent now; sets `stopped` once a stop string has ended the choice."""
        self.text += delta
        if not self.stops:
            return self._send(len(self.text))
        cut = _first_stop(self.text, self.stops)
        # A stop string may still complete at the first position whose rest of the text begins one.
        held = next((q for q in range(self.sent, len(self.text)) if self._opens_stop(self.text[q:])), None)
        if cut is not None and (held is None or held >= cut):
            self.stopped = True  # no stop string can complete at an earlier position any more
            return self._send(cut)
        return self._send(min(x for x in (cut, held, len(self.text)) if x is not None))

    def finish(self) -> tuple[str, bool]:
        """What is left to send once the model finished the choice, and whether a stop string cut it."""
        text, stopped = apply_stop(self.text, self.stops)
        return self._send(len(text)), stopped

    def _opens_stop(self, rest: str) -> bool:
        return any(len(s) > len(rest) and s.startswith(rest) for s in self.stops)

    def _send(self, upto: int) -> str:
        out, self.sent = self.text[self.sent : upto], max(self.sent, upto)
        return out


class _Chunks:
    """A stream's chunks: each choice's text as the decode steps bring it (after its stop strings),
    one chunk per token, then its finish chunk; the usage chunk last when asked for."""

    def __init__(self, head: dict[str, Any], job: _Job, include_usage: bool) -> None:
        self.head, self.job, self.include_usage = head, job, include_usage
        self.extra: dict[str, Any] = {"usage": None} if include_usage else {}
        count = len(job.prompts) * job.n
        self.texts = [_StopText(job.stop) for _ in range(count)]
        self.outs: list[Any] = [None] * count
        self.open = [True] * count

    def start(self) -> Iterator[dict[str, Any]]:
        return iter(())

    def text_chunk(self, index: int, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def finish_chunk(self, index: int, reason: str) -> dict[str, Any]:
        raise NotImplementedError

    def step(self, step: Step) -> Iterator[dict[str, Any]]:
        for i, (delta, out) in enumerate(zip(step.text, step.finished, strict=True)):
            if out is not None:
                self.outs[i] = out  # kept for the usage even when a stop string ended the choice before
            if not self.open[i]:
                continue
            text = self.texts[i]
            send = text.feed(delta)
            reason = "stop" if text.stopped else None
            if reason is None and out is not None:
                rest, stopped = text.finish()
                send += rest
                reason = "stop" if stopped else out.finish_reason
            for piece in _tokens(send):
                yield self.text_chunk(i, piece)
            if reason is not None:
                self.open[i] = False
                yield self.finish_chunk(i, reason)

    def end(self) -> Iterator[dict[str, Any]]:
        if self.include_usage:
            yield {**self.head, "choices": [], "usage": _usage(self.job.prompts, self.outs)}


class _CompletionChunks(_Chunks):
    def __init__(self, head: dict[str, Any], job: _Job, include_usage: bool, echo: bool) -> None:
        super().__init__(head, job, include_usage)
        self.echo = echo

    def start(self) -> Iterator[dict[str, Any]]:
        if self.echo:
            for i in range(len(self.texts)):
                yield self.text_chunk(i, self.job.prompts[i // self.job.n])

    def text_chunk(self, index: int, text: str) -> dict[str, Any]:
        return self._chunk(index, text, None)

    def finish_chunk(self, index: int, reason: str) -> dict[str, Any]:
        return self._chunk(index, "", reason)

    def _chunk(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        return {**self.head, "choices": [{"text": text, "index": index, "finish_reason": reason, "logprobs": None}],
                **self.extra}  # fmt: skip


class _ChatChunks(_Chunks):
    def start(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self.texts)):
            yield self._chunk(i, {"role": "assistant", "content": ""}, None)

    def text_chunk(self, index: int, text: str) -> dict[str, Any]:
        return self._chunk(index, {"content": text}, None)

    def finish_chunk(self, index: int, reason: str) -> dict[str, Any]:
        return self._chunk(index, {}, reason)

    def _chunk(self, index: int, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "finish_reason": reason, "logprobs": None}
        return {**self.head, "choices": [choice], **self.extra}


def _event(chunk: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()


class _EventStream(StreamingResponse):
    """Server-sent events as OpenAI sends them: `data: {json}` events, then `data: [DONE]`.

    `on_close` runs however the response ends: a client that goes away before the body starts leaves
    the body's own cleanup unrun.
    """

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def build_app(service: OpenAIService) -> FastAPI:
    """The same routes as the Serve ingress, bound to one service: for in-process use and tests."""
    app = FastAPI(title=f"tpuflow {service.model_name}")
    install_error_handlers(app)
    app.add_api_route("/v1/models", service.list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id}", service.get_model, methods=["GET"])
    app.add_api_route("/v1/completions", service.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", service.chat_completions, methods=["POST"])
    return app
