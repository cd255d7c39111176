"""The Serve application through the official openai client."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from addition import data
from addition.serve_app import app_builder

MODEL = "addition-demo"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def client(ray_local: dict[str, Any], trained: dict[str, Any]) -> Iterator[openai.OpenAI]:
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = app_builder({"checkpoint": trained["checkpoint"], "framework": "jax", "model_name": MODEL})
        serve.run(app, name="addition", route_prefix="/addition")
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/addition/v1", api_key="x", max_retries=0, timeout=30)
    finally:
        serve.shutdown()


def test_openai_client_gets_the_sum(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    resp = client.completions.create(model=MODEL, prompt="17+25=", max_tokens=4)
    assert resp.object == "text_completion" and resp.model == MODEL and resp.id.startswith("cmpl-")
    assert resp.choices[0].text == "42"
    assert (resp.choices[0].index, resp.choices[0].finish_reason, resp.choices[0].logprobs) == (0, "stop", None)
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (6, 3, 9)


def test_batch_of_heldout_prompts_and_limits(client: openai.OpenAI, trained: dict[str, Any]) -> None:
    held = data.generate(trained["date"], "heldout", 100, num_heldout=200)
    resp = client.completions.create(model=MODEL, prompt=list(held["prompt"]), max_tokens=8, temperature=0)
    texts = [c.text for c in sorted(resp.choices, key=lambda c: c.index)]
    assert sum(t == a for t, a in zip(texts, held["answer"], strict=True)) >= 90
    short = client.completions.create(model=MODEL, prompt="17+25=", max_tokens=1)
    assert (short.choices[0].text, short.choices[0].finish_reason) == ("4", "length")
    echoed = client.completions.create(model=MODEL, prompt="17+25=", max_tokens=4, echo=True, n=2)
    assert [c.text for c in echoed.choices] == ["17+25=42", "17+25=42"]
    sampled = client.completions.create(model=MODEL, prompt="17+25=", max_tokens=4, temperature=0.7, seed=1)
    assert sampled.choices[0].text.isdigit()


def test_errors_come_back_in_openai_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="1+1=", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="outside"):
        client.completions.create(model=MODEL, prompt="1-1=", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="n"):  # stream=true is served now (test_addition_openai)
        client.completions.create(model=MODEL, prompt="1+1=", max_tokens=2, n=17)


def test_app_builder_rejects_bad_args(trained: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown args"):
        app_builder({"checkpoint": trained["checkpoint"], "framework": "jax", "modle_name": "x"})
    with pytest.raises(ValueError, match="framework"):
        app_builder({"checkpoint": trained["checkpoint"], "framework": "tensorflow"})
    with pytest.raises(ValueError, match="checkpoint"):
        app_builder({"framework": "jax"})
