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


def _options(args: dict[str, Any]) -> Any:
    app = app_builder({"checkpoint": "/ckpt", "framework": "jax", **args})
    return app._bound_deployment  # the deployment the app's ingress runs


def test_replica_placement_follows_the_slice() -> None:
    cpu = _options({})
    assert cpu.ray_actor_options == {"num_cpus": 0.25} and cpu.init_args[3] == "jax"  # the trained framework
    single = _options({"accelerator_type": "TPU-V6E", "accelerator_config": {"kind": "tpu", "topology": "2x2"},
                       "chips_per_host": 4})  # fmt: skip
    assert single.ray_actor_options["resources"] == {"TPU": 4}
    assert single.ray_actor_options["accelerator_type"] == "TPU-V6E"
    multi = _options({"accelerator_type": "TPU-V6E", "accelerator_config": {"kind": "tpu", "topology": "4x4"},
                      "chips_per_host": 4, "num_replicas": 2})  # fmt: skip
    # Deferred placement: no TPU and no placement group from Serve; the replica reserves the slice.
    assert "resources" not in multi.ray_actor_options and multi._replica_config.placement_group_bundles is None
    assert multi.ray_actor_options["label_selector"] == {"ray.io/accelerator-type": "TPU-V6E"}
    assert multi.num_replicas == 2 and multi.init_args[4]["topology"] == "4x4"
    straddling = _options({"accelerator_type": "TPU-V6E", "accelerator_config": {"kind": "tpu"}, "chips_per_host": 4,
                           "num_devices": 8})  # fmt: skip
    assert straddling._replica_config.placement_group_bundles[1:] == [{"TPU": 1, "accelerator_type:TPU-V6E": 0.001}] * 8


def test_app_builder_rejects_bad_tpu_args() -> None:
    base = {"checkpoint": "/ckpt", "framework": "jax", "accelerator_type": "TPU-V6E", "chips_per_host": 4}
    with pytest.raises(ValueError, match="accelerator_config"):
        app_builder({**base, "accelerator_config": {"kind": "gpu"}})
    with pytest.raises(ValueError, match="topology"):
        app_builder({**base, "accelerator_config": {"kind": "tpu"}})
    with pytest.raises(ValueError, match="chips_per_host"):
        app_builder({**base, "chips_per_host": 0, "accelerator_config": {"kind": "tpu", "topology": "4x4"}})
    with pytest.raises(ValueError, match="one JAX mesh"):
        app_builder({**base, "backend": "numpy", "accelerator_config": {"kind": "tpu", "topology": "4x4"}})
