"""The OpenAI surface of the addition endpoint: the official client in-process, exact SSE wire format,
chat mapping, usage, OpenAI-shaped errors and request limits; one test through a real Serve deployment."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from addition.data import TaskSpec, encode_prompt
from addition.inference import Completion
from addition.openai_api import Limits, OpenAIService, build_app
from fastapi.testclient import TestClient

MODEL = "addition-demo"
SPEC = TaskSpec()


def oracle(prompts: list[str], max_new_tokens: int | None = None, temperature: float = 0.0, rng: Any = None):
    """The model's contract (inference.generate_stream) with exact sums: eos counts as a token, cut at the budget."""
    out = []
    for p in prompts:
        encode_prompt(p, SPEC)  # the real tokenizer's refusals (TokenizeError)
        a, b = p.rstrip("=").split("+")
        text = str(int(a) + int(b))
        limit = SPEC.answer_len if max_new_tokens is None else max_new_tokens
        if len(text) + 1 <= limit:
            out.append(Completion(text, "stop", len(text) + 1))
        else:
            out.append(Completion(text[:limit], "length", limit))
    return out


@pytest.fixture
def http() -> Iterator[TestClient]:
    with TestClient(build_app(OpenAIService(oracle, MODEL, created=1))) as client:
        yield client


@pytest.fixture
def client(http: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def sse_events(body: str) -> list[str]:
    assert body.endswith("\n\n")
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: ") :] for e in events]


def test_completion_and_usage_through_the_official_client(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "tpuflow"
    resp = client.completions.create(model=MODEL, prompt=["17+25=", "99+99="], max_tokens=4, n=2, echo=True)
    assert [c.text for c in resp.choices] == ["17+25=42", "17+25=42", "99+99=198", "99+99=198"]
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    # prompts count once (6 + 6 characters); each choice generated its digits plus eos
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (12, 14, 26)


def test_streamed_completion_is_what_the_client_reassembles(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL, prompt="17+25=", max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert {c.object for c in chunks} == {"text_completion"} and len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "42"
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, None, "stop"]
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (6, 3)


def test_stream_wire_format_is_exact(http: TestClient) -> None:
    resp = http.post("/v1/completions", json={"model": MODEL, "prompt": "1+1=", "max_tokens": 1, "stream": True})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["2", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)  # no include_usage: no usage key at all
    assert set(chunks[0]) == {"id", "object", "created", "model", "choices"}


def test_chat_completion_maps_the_last_user_message(client: openai.OpenAI) -> None:
    messages: Any = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": [{"type": "text", "text": "17+25"}]},
    ]
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=8)
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert (resp.choices[0].message.role, resp.choices[0].message.content) == ("assistant", "42")
    assert resp.choices[0].finish_reason == "stop"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (6, 3, 9)
    short = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "99+99="}], max_tokens=2)
    assert (short.choices[0].message.content, short.choices[0].finish_reason) == ("19", "length")


def test_streamed_chat_chunks(client: openai.OpenAI, http: TestClient) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "17+25="}],
            stream=True,
            stream_options={"include_usage": True},
            n=2,
        )
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(ch.delta.content or "" for ch in mine) == "42"
        assert [ch.finish_reason for ch in mine][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    raw = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "2+2="}], "stream": True}
    )
    first = json.loads(sse_events(raw.text)[0])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "needle"),
    [
        ("/v1/completions", {"model": "gpt-4", "prompt": "1+1="}, 404, "model", "does not exist"),
        (
            "/v1/chat/completions",
            {"model": "gpt-4", "messages": [{"role": "user", "content": "1+1"}]},
            404,
            "model",
            "does not exist",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "1-1="}, 400, "prompt", "outside"),
        ("/v1/completions", {"model": MODEL, "prompt": "120+7="}, 400, "prompt", "at most 2 digits"),
        ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "prompt", "empty"),
        ("/v1/completions", {"model": MODEL, "prompt": "1+1=", "max_tokens": -1}, 400, "max_tokens", "greater"),
        ("/v1/completions", {"model": MODEL, "prompt": "1+1=", "n": 17}, 400, "n", "less than"),
        ("/v1/completions", {"model": MODEL, "prompt": "1+1=", "temperature": 3}, 400, "temperature", "less"),
        ("/v1/completions", {"model": MODEL, "prompt": [[1, 2]]}, 400, "prompt", "valid"),
        ("/v1/completions", {"model": MODEL, "prompt": ["1+1="] * 100, "n": 16}, 400, "prompt", "exceeds"),
        ("/v1/completions", {"prompt": "1+1="}, 400, "model", "required"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages", "at least 1"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "system", "content": "hi"}]},
            400,
            "messages",
            "user message",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "robot", "content": "1+1"}]},
            400,
            "messages.0.role",
            "Input should be",
        ),
    ],
)
def test_every_bad_request_gets_an_openai_error(
    http: TestClient, path: str, body: dict[str, Any], status: int, param: str, needle: str
) -> None:
    resp = http.post(path, json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert needle in error["message"]


def test_malformed_bodies_and_unknown_routes_are_openai_shaped(http: TestClient) -> None:
    bad_json = http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
    not_object = http.post("/v1/completions", json=["a"])
    assert not_object.status_code == 400 and "JSON object" in not_object.json()["error"]["message"]
    missing = http.get("/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong_method = http.get("/v1/completions")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    unknown_model = http.get("/v1/models/gpt-4")
    assert unknown_model.status_code == 404 and unknown_model.json()["error"]["code"] == "model_not_found"


def test_client_raises_the_matching_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "1+1"}])
    with pytest.raises(openai.BadRequestError, match="outside"):
        client.completions.create(model=MODEL, prompt="1-1=", stream=True)  # refused before any event


class Gate:
    """A `complete` that blocks until released, to hold requests in flight."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, prompts: list[str], **kwargs: Any) -> list[Completion]:
        self.started.set()
        assert self.release.wait(30)
        return oracle(prompts, **kwargs)


def _post_concurrently(service: OpenAIService, gate: Gate) -> tuple[httpx.Response, httpx.Response]:
    async def go() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=build_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            body = {"model": MODEL, "prompt": "1+1="}
            first = asyncio.create_task(http.post("/v1/completions", json=body))
            await asyncio.to_thread(gate.started.wait, 30)
            second = await http.post("/v1/completions", json=body)
            gate.release.set()
            return await first, second

    return asyncio.run(go())


def test_too_many_requests_in_flight_get_429_with_retry_after() -> None:
    gate = Gate()
    service = OpenAIService(gate, MODEL, 1, Limits(max_inflight_requests=1, retry_after_s=2))
    first, second = _post_concurrently(service, gate)
    assert first.status_code == 200 and first.json()["choices"][0]["text"] == "2"
    assert second.status_code == 429 and second.headers["retry-after"] == "2"
    assert second.json()["error"]["code"] == "rate_limit_exceeded"


def test_busy_model_past_the_timeout_gets_503_and_a_slow_forward_504() -> None:
    gate = Gate()
    service = OpenAIService(gate, MODEL, 1, Limits(request_timeout_s=0.2, max_concurrent_forward=1))
    first, second = _post_concurrently(service, gate)
    # the second never got the model (503, retry); the first's forward pass outlived its timeout (504)
    assert second.status_code == 503 and second.headers["retry-after"] == "1"
    assert second.json()["error"]["code"] == "overloaded"
    assert first.status_code == 504 and first.json()["error"]["code"] == "request_timeout"


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"request_timeout": 1}, "unknown user_config keys"),
        ({"request_timeout_s": 0}, "positive"),
        ({"max_inflight_requests": 0}, ">= 1"),
        ({"max_concurrent_forward": 1.5}, ">= 1"),
    ],
)
def test_limits_refuse_bad_user_config(config: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Limits.from_user_config(config)


# --- through a real Serve deployment -------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_real_serve_deployment_streams_chats_and_applies_deployment_options(
    ray_local: dict[str, Any], trained: dict[str, Any]
) -> None:
    from addition.serve_app import AdditionCompletions
    from ray import serve

    from tpuflow.serve.deployment_options import DeploymentOptions

    options = DeploymentOptions(
        autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4},
        max_ongoing_requests=16,
        request_timeout_s=30,
        user_config={"request_timeout_s": 30, "max_inflight_requests": 8},
    ).validated()
    entry = options.deployment_entry("AdditionCompletions")
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port, **options.http_options()})
    try:
        app = AdditionCompletions.options(**{k: v for k, v in entry.items() if k != "name"}).bind(
            trained["checkpoint"], "jax", MODEL
        )
        serve.run(app, name="addition-openai", route_prefix="/addition")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/addition/v1", api_key="x", max_retries=0, timeout=60)
        chunks = list(client.completions.create(model=MODEL, prompt="17+25=", max_tokens=4, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == "42"
        chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "17+25"}])
        assert chat.choices[0].message.content == "42"
        # the replica streams decode steps through Serve's proxy: the same answers, stop strings and usage
        ask: Any = {"model": MODEL, "messages": [{"role": "user", "content": "17+25"}], "n": 2, "stop": "2"}
        plain = client.chat.completions.create(**ask)
        streamed = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
        for c in plain.choices:
            mine = [ch.choices[0] for ch in streamed if ch.choices and ch.choices[0].index == c.index]
            assert "".join(m.delta.content or "" for m in mine) == c.message.content == "4"
            assert mine[-1].finish_reason == c.finish_reason == "stop"
        assert streamed[-1].usage == plain.usage
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            client.completions.create(model=MODEL, prompt="1+1=", max_tokens=-1)
        status = serve.status().applications["addition-openai"].deployments["AdditionCompletions"]
        assert status.status.value == "HEALTHY"
    finally:
        serve.delete("addition-openai")
        serve.shutdown()
