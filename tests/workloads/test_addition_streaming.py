"""Token-by-token streaming: the decode loop as a generator (inference.generate_stream), the OpenAI
routes sending each step's tokens as soon as it returns (in-process app, official client), stop strings,
usage and timeouts mid-stream; one test through a multi-host replica's host actor."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import openai
import pytest
from addition import data
from addition.inference import Completion, Predictor, Step, completions, generate_stream
from addition.model_jax import ModelConfig, init_params
from addition.openai_api import Limits, OpenAIService, build_app
from fastapi.testclient import TestClient
from support.exact_addition import META, SPEC, exact_sums

MODEL = "addition-demo"
WATCHDOG_S = 60.0  # only keeps a broken stream from hanging the test; never part of an assertion


class Gated:
    """A logits function whose `hold`-th call (1-based) waits for `release`: a decode step still running."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray], hold: int) -> None:
        self.fn, self.hold = fn, hold
        self.calls = self.returned = 0
        self.release = threading.Event()

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == self.hold:
            assert self.release.wait(WATCHDOG_S)
        out = self.fn(ids)
        self.returned += 1
        return out


def predictor(logits: Callable[[np.ndarray], np.ndarray] | None = None) -> Predictor:
    """An untrained model (random answers, good for sampling) or, given `logits`, that model."""
    pred = Predictor(init_params(ModelConfig(), seed=3), META)
    if logits is not None:
        pred._logits = logits
    return pred


def service_for(pred: Any, limits: Limits | None = None) -> OpenAIService:
    return OpenAIService(pred.complete, MODEL, 1, limits, stream=pred.stream)


@pytest.fixture
def watchdog() -> Iterator[list[Gated]]:
    """Gates registered here are released when the test ends, however it ends."""
    gates: list[Gated] = []
    yield gates
    for gate in gates:
        gate.release.set()


def sse_events(body: str) -> list[str]:
    assert body.endswith("\n\n")
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: ") :] for e in events]


def streamed(http: TestClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    resp = http.post(path, json={**body, "stream": True})
    assert resp.status_code == 200, resp.text
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def joined(chunks: list[dict[str, Any]]) -> dict[int, tuple[str, str]]:
    """index -> (text, finish_reason) as a client reassembles a stream; each choice finishes once, last."""
    texts: dict[int, str] = defaultdict(str)
    reasons: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            i = choice["index"]
            assert i not in reasons, f"choice {i} has a chunk after its finish"
            texts[i] += choice["text"] if "text" in choice else choice["delta"].get("content") or ""
            if choice["finish_reason"] is not None:
                reasons[i] = choice["finish_reason"]
    assert reasons.keys() == texts.keys()
    return {i: (texts[i], reasons[i]) for i in sorted(texts)}


def pieces(chunks: list[dict[str, Any]]) -> list[str]:
    """The non-empty text pieces of a stream, in order."""
    out = [c["text"] if "text" in c else c["delta"].get("content") for chunk in chunks for c in chunk["choices"]]
    return [p for p in out if p]


def eventually(check: Callable[[], bool]) -> bool:
    """`check` once the server has run its cleanup after the client's last read (a client stops at [DONE])."""
    done = threading.Event()
    for _ in range(int(WATCHDOG_S * 100)):
        if check():
            return True
        done.wait(0.01)
    return check()


def answered(body: dict[str, Any]) -> dict[int, tuple[str, str]]:
    out = {}
    for choice in body["choices"]:
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        out[choice["index"]] = (text, choice["finish_reason"])
    return out


def finished(steps: list[Step]) -> list[Completion]:
    """Each sequence's completion from a stream, checking that it finished exactly once."""
    outs = [[s.finished[i] for s in steps if s.finished[i] is not None] for i in range(len(steps[0].text))]
    assert all(len(o) == 1 for o in outs), outs
    return [o[0] for o in outs if o[0] is not None]


# --- the decode loop as a generator ----------------------------------------------------------------


@pytest.mark.parametrize(("temperature", "limit"), [(0.0, 4), (1.0, 4), (1.5, 2), (1.0, 0)])
def test_completions_are_the_stream_run_to_its_end(temperature: float, limit: int) -> None:
    pred = predictor()
    prompts = ["17+25=", "3+4=", "99+99=", "0+0="] * 4
    ids = np.stack([data.encode_prompt(p, SPEC) for p in prompts])
    steps = list(generate_stream(pred._logits, ids, SPEC, limit, temperature, np.random.default_rng(11)))
    outs = completions(generate_stream(pred._logits, ids, SPEC, limit, temperature, np.random.default_rng(11)))
    assert finished(steps) == outs
    assert ["".join(s.text[i] for s in steps) for i in range(len(prompts))] == [o.text for o in outs]
    assert outs == pred.complete(prompts, limit, temperature, np.random.default_rng(11))
    assert finished(list(pred.stream(prompts, limit, temperature, np.random.default_rng(11)))) == outs
    if temperature and limit:  # seeded: the same samples however the stream is read, others for another seed
        resampled = generate_stream(pred._logits, ids, SPEC, limit, temperature, np.random.default_rng(12))
        assert outs != completions(resampled)


def test_stream_holds_leading_zeros_until_a_digit_decides_them() -> None:
    gated = Gated(exact_sums, hold=0)
    steps = list(predictor(gated).stream(["17+25=", "3+4=", "0+0="]))  # written "042", "007", "000"
    assert [s.text for s in steps] == [("", "", ""), ("4", "", ""), ("2", "7", ""), ("", "", "0")]
    assert [[c and (c.text, c.finish_reason, c.num_tokens) for c in s.finished] for s in steps] == [
        [None, None, None],
        [None, None, None],
        [None, None, None],
        [("42", "stop", 3), ("7", "stop", 2), ("0", "stop", 2)],
    ]
    assert gated.calls == 4  # one forward pass per step, eos included


def test_decode_ends_once_every_sequence_has_its_tokens() -> None:
    gated = Gated(exact_sums, hold=0)
    steps = list(predictor(gated).stream(["17+25=", "99+99="], max_new_tokens=1))
    assert finished(steps) == [Completion("4", "length", 1), Completion("1", "length", 1)]
    assert gated.calls == 2  # "0" then "4" for the first; no step for the eos nobody will read
    assert list(predictor(gated).stream([])) == []


# --- the OpenAI routes ------------------------------------------------------------------------------

BODIES = [
    pytest.param({"prompt": ["17+25=", "99+99="], "max_tokens": 8}, id="greedy"),
    pytest.param({"prompt": "17+25=", "n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 4}, id="sampled-n2"),
    pytest.param(
        {"prompt": ["5+5=", "98+1="], "n": 2, "temperature": 1.5, "seed": 3, "max_tokens": 3, "stop": ["1", "="]},
        id="sampled-stop",
    ),  # fmt: skip
    pytest.param({"prompt": ["17+25=", "3+4="], "echo": True, "temperature": 1.0, "seed": 1}, id="echo"),
]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streamed_text_is_the_completion(path: str, body: dict[str, Any]) -> None:
    if path.endswith("chat/completions"):
        prompts = [body["prompt"]] if isinstance(body["prompt"], str) else body["prompt"]
        body = {k: v for k, v in body.items() if k not in ("prompt", "echo")}
        body["messages"] = [{"role": "user", "content": prompts[0]}]
    with TestClient(build_app(service_for(predictor()))) as http:
        resp = http.post(path, json={"model": MODEL, **body})
        assert resp.status_code == 200, resp.text
        chunks = streamed(http, path, {"model": MODEL, **body})
    assert joined(chunks) == answered(resp.json())
    if not body.get("echo"):  # one chunk per token (an echo's first chunk is the prompt)
        assert all(len(piece) == 1 for piece in pieces(chunks))


@pytest.mark.parametrize(
    ("stop", "text", "reason"),
    [
        ("9", "1", "stop"),
        (["98", "9"], "1", "stop"),
        (["198", "9"], "", "stop"),  # "19" holds "9" back: the longer stop string begins earlier
        ("195", "198", "stop"),  # "19" held, then sent: eos is the stop
        ("8", "19", "stop"),
    ],
)
def test_stop_strings_when_streaming(stop: str | list[str], text: str, reason: str) -> None:
    body = {"model": MODEL, "prompt": ["99+99=", "1+1="], "stop": stop, "n": 2}
    with TestClient(build_app(service_for(predictor(exact_sums)))) as http:
        plain = answered(http.post("/v1/completions", json=body).json())
        chunks = streamed(http, "/v1/completions", body)
    assert joined(chunks) == plain == {0: (text, reason), 1: (text, reason), 2: ("2", "stop"), 3: ("2", "stop")}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_include_usage_last_chunk(path: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "n": 2, "stop": "8", "stream_options": {"include_usage": True}}
    body |= {"messages": [{"role": "user", "content": "99+99"}]} if "chat" in path else {"prompt": "99+99="}
    with TestClient(build_app(service_for(predictor(exact_sums)))) as http:
        usage = http.post(path, json=body).json()["usage"]
        chunks = streamed(http, path, body)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage
    assert all(c["usage"] is None for c in chunks[:-1])
    # prompt once; each choice's model tokens ("198" and eos) even though the stop string cut its text
    assert usage == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}
    no_usage = {k: v for k, v in body.items() if k != "stream_options"}
    with TestClient(build_app(service_for(predictor(exact_sums)))) as http:
        assert all("usage" not in c for c in streamed(http, path, no_usage))


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_chunks_arrive_while_later_decode_steps_are_pending(path: str, watchdog: list[Gated]) -> None:
    gated = Gated(exact_sums, hold=3)  # step 1 writes "0" (held), step 2 "4"; step 3 ("2") waits
    watchdog.append(gated)
    with TestClient(build_app(service_for(predictor(gated)))) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)
        if "chat" in path:
            stream: Any = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "17+25"}], stream=True
            )
            chunks = iter(stream)
            assert next(chunks).choices[0].delta.role == "assistant"
            first = next(chunks).choices[0].delta.content
        else:
            chunks = iter(client.completions.create(model=MODEL, prompt="17+25=", stream=True))
            first = next(chunks).choices[0].text
        # the client has the first digit while the step that writes the second has not returned
        assert first == "4"
        assert (gated.returned, gated.release.is_set()) == (2, False)
        gated.release.set()
        rest = list(chunks)
    pieces = [c.choices[0].delta.content if "chat" in path else c.choices[0].text for c in rest]
    assert [p or "" for p in pieces] == ["2", ""] and rest[-1].choices[0].finish_reason == "stop"
    assert gated.calls == 4


def test_a_timeout_mid_stream_ends_it_with_an_error_event(watchdog: list[Gated]) -> None:
    gated = Gated(exact_sums, hold=3)
    watchdog.append(gated)
    service = service_for(predictor(gated), Limits(request_timeout_s=1.0, max_concurrent_forward=1))
    body = {"model": MODEL, "prompt": "17+25=", "stream": True}
    with TestClient(build_app(service)) as http:
        try:
            resp = http.post("/v1/completions", json=body)  # the stream ends at the deadline, step 3 still held
        finally:
            gated.release.set()
        assert resp.status_code == 200
        events = sse_events(resp.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert [c["choices"][0] for c in chunks[:-1]] == [
            {"text": "4", "index": 0, "finish_reason": None, "logprobs": None}
        ]
        error = chunks[-1]["error"]
        assert (error["type"], error["code"]) == ("timeout_error", "request_timeout") and "1.0s" in error["message"]
        # the abandoned step gave the model back once it returned: the next request gets it
        again = http.post("/v1/completions", json={"model": MODEL, "prompt": "17+25="})
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == "42"
        assert gated.calls == 3 + 4  # the timed-out decode took no step after the held one
        assert service._inflight == 0

        gated2 = Gated(exact_sums, hold=2)  # the official client raises the error event
        watchdog.append(gated2)
        service2 = service_for(predictor(gated2), Limits(request_timeout_s=1.0))
        with TestClient(build_app(service2)) as http2:
            client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http2, max_retries=0)
            with pytest.raises(openai.APIError, match="did not finish within its timeout"):
                list(client.completions.create(model=MODEL, prompt="17+25=", stream=True))
            gated2.release.set()


def test_a_model_failing_mid_stream_ends_it_with_an_error_event() -> None:
    def breaks_at_step_3(ids: np.ndarray) -> np.ndarray:
        if (ids[:, SPEC.prompt_len :] != data.PAD).sum() >= 2:
            raise RuntimeError("device lost")
        return exact_sums(ids)

    service = service_for(predictor(breaks_at_step_3), Limits(max_concurrent_forward=1))
    with TestClient(build_app(service)) as http:
        chunks = [json.loads(e) for e in sse_events(http.post("/v1/completions", json={
            "model": MODEL, "prompt": "17+25=", "stream": True}).text)[:-1]]  # fmt: skip
        assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["4"]
        assert chunks[-1]["error"]["code"] == "internal_error" and "device lost" in chunks[-1]["error"]["message"]
        assert service._inflight == 0 and not service._slots.locked()  # the model is free again


def test_stream_refusals_are_http_errors_before_the_stream(watchdog: list[Gated]) -> None:
    gated = Gated(exact_sums, hold=3)
    watchdog.append(gated)
    service = service_for(predictor(gated), Limits(max_inflight_requests=1))
    with TestClient(build_app(service)) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)
        first = iter(client.completions.create(model=MODEL, prompt="17+25=", stream=True))
        assert next(first).choices[0].text == "4"  # in flight, mid-stream
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt="1+1=", stream=True)
        gated.release.set()
        assert "".join(c.choices[0].text for c in first) == "2"
        assert eventually(lambda: service._inflight == 0)
        with pytest.raises(openai.BadRequestError, match="outside"):
            client.completions.create(model=MODEL, prompt="1-1=", stream=True)
        assert service._inflight == 0


def test_a_client_leaving_mid_stream_frees_the_model(watchdog: list[Gated]) -> None:
    gated = Gated(exact_sums, hold=3)
    watchdog.append(gated)
    service = service_for(predictor(gated), Limits(max_concurrent_forward=1, request_timeout_s=WATCHDOG_S))
    with TestClient(build_app(service)) as http:
        with http.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "17+25=", "stream": True}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    assert json.loads(line[6:])["choices"][0]["text"] == "4"
                    break
        gated.release.set()  # the held step returns into a closed stream
        again = http.post("/v1/completions", json={"model": MODEL, "prompt": "3+4="})
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == "7"
        assert service._inflight == 0


# --- a multi-host replica's hosts ---------------------------------------------------------------------


@pytest.mark.slow
def test_slice_predictor_streams_one_step_per_call_on_its_hosts(ray_local: dict[str, Any]) -> None:
    """SlicePredictor.stream over one SliceHost (a one-process JAX mesh on CPU, joined by hand rather than
    reserved): the same completions as its `complete`, and a stream closed early is dropped on the hosts."""
    import ray
    from addition.slice_serving import SliceHost, SlicePredictor

    params = init_params(ModelConfig(), seed=3)
    host = SliceHost.options(num_cpus=0).remote(params, META)
    try:
        me = ray.get(host.identity.remote())
        assert ray.get(host.join.remote(ray.get(host.coordinator_address.remote()), [me], 0, 1), timeout=120) == 1
        model = SlicePredictor.__new__(SlicePredictor)  # the replica's model, minus the slice reservation
        model.meta, model.spec, model.workers, model._send, model._slice = META, SPEC, [host], threading.Lock(), None
        prompts = ["17+25=", "3+4=", "99+99="]
        greedy = list(model.stream(prompts, max_new_tokens=4))
        assert len(greedy) >= 3  # one step per forward pass, not one answer
        assert finished(greedy) == model.complete(prompts, 4) == Predictor(params, META).complete(prompts, 4)
        sampled = model.stream(prompts, 4, 1.0, np.random.default_rng(5))
        assert finished(list(sampled)) == model.complete(prompts, 4, 1.0, np.random.default_rng(5))

        early = model.stream(prompts)
        next(early)
        assert ray.get(host.__ray_call__.remote(lambda h: len(h._streams))) == 1
        early.close()
        assert ray.get(host.__ray_call__.remote(lambda h: len(h._streams))) == 0

        with TestClient(build_app(service_for(model))) as http:
            body = {"model": MODEL, "prompt": prompts, "n": 2, "temperature": 1.0, "seed": 2, "max_tokens": 3}
            plain = answered(http.post("/v1/completions", json=body).json())
            assert joined(streamed(http, "/v1/completions", body)) == plain
    finally:
        ray.get(host.leave.remote())
        ray.kill(host)
