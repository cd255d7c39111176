"""Opt-in request batching of non-streaming greedy completions (openai_api.forward_batch behind Ray
Serve's own `@serve.batch`), in-process and without a Ray cluster: the same answers as unbatched, each
request's own max_tokens / stop / n / echo, errors kept to their own request, streams and sampled
requests never batched, and the switch (user_config) off unless asked for."""

from __future__ import annotations

import asyncio
import json
import threading
import types
from typing import Any

import httpx
import pytest
from addition.data import TokenizeError
from addition.inference import Completion, Predictor
from addition.model_jax import ModelConfig, init_params
from addition.openai_api import Limits, OpenAIService, _expanded, _Job, build_app, forward_batch
from support.exact_addition import META, exact_sums

MODEL = "addition-demo"


def predictor(model: str) -> Predictor:
    """An untrained model (random answers that rarely end early) or a perfect one (eos, leading zeros)."""
    pred = Predictor(init_params(ModelConfig(), seed=3), META)
    if model == "exact":
        pred._logits = exact_sums
    return pred


class Recorder:
    """A `complete` that records each call (its prompts and keywords)."""

    def __init__(self, complete: Any) -> None:
        self.complete = complete
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, prompts: list[str], **kwargs: Any) -> list[Completion]:
        self.calls.append((list(prompts), kwargs))
        return self.complete(prompts, **kwargs)


@pytest.fixture
def replica_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `@serve.batch` asks of the replica it runs in (only max_ongoing_requests, for a warning)."""
    from ray import serve

    ctx = types.SimpleNamespace(_deployment_config=types.SimpleNamespace(max_ongoing_requests=64))
    monkeypatch.setattr(serve, "get_replica_context", lambda: ctx)


def job(prompts: list[str], max_tokens: int | None, n: int = 1) -> _Job:
    return _Job(prompts, n, max_tokens, 0.0, None, None)


JOBS = [
    job(["17+25="], 4),
    job(["99+99=", "3+4="], None, n=2),
    job(["0+0="], 0),
    job(["5+5="], 1),
    job(["98+1=", "10+90="], 2),
    job(["1+1="], 10),
    job(["50+50="], 3),
]


@pytest.mark.parametrize("model", ["untrained", "exact"])
def test_one_forward_call_gives_each_job_what_it_gets_alone(model: str) -> None:
    pred = predictor(model)
    calls = Recorder(pred.complete)
    batched = forward_batch(calls, JOBS)
    alone = [pred.complete(_expanded(j), max_new_tokens=j.max_tokens) for j in JOBS]
    assert batched == alone
    # one call: 1 + 4 + 1 + 1 + 2 + 1 + 1 = 11 rows, padded to 16, decoded to the largest budget (None)
    ((prompts, kwargs),) = calls.calls
    assert len(prompts) == 16 and prompts[11:] == ["50+50="] * 5
    assert kwargs == {"max_new_tokens": None, "temperature": 0.0}
    if model == "exact":  # the budgets cut where a decode with that budget ends: eos counts as a token
        assert [o[0] for o in batched] == [
            Completion("42", "stop", 3),
            Completion("198", "stop", 4),
            Completion("", "length", 0),
            Completion("1", "length", 1),
            Completion("99", "length", 2),
            Completion("2", "stop", 2),
            Completion("100", "length", 3),
        ]


def test_all_budgets_given_decode_to_the_largest() -> None:
    calls = Recorder(predictor("exact").complete)
    assert [o[0].text for o in forward_batch(calls, [job(["17+25="], 1), job(["3+4="], 2)])] == ["4", "7"]
    assert calls.calls[0][1]["max_new_tokens"] == 2 and len(calls.calls[0][0]) == 2


def test_a_bad_prompt_fails_only_its_own_job() -> None:
    pred = predictor("exact")
    calls = Recorder(pred.complete)
    out = forward_batch(calls, [job(["17+25="], 4), job(["1-1="], 4), job(["3+4="], None)])
    assert out[0] == pred.complete(["17+25="], max_new_tokens=4)
    assert isinstance(out[1], TokenizeError)
    assert out[2] == pred.complete(["3+4="])
    assert [len(p) for p, _ in calls.calls] == [4, 1, 1, 1]  # the batch, then each job alone


# --- through the routes, with Ray Serve's own @serve.batch -----------------------------------------

BODIES: list[dict[str, Any]] = [
    {"prompt": "17+25=", "max_tokens": 4},
    {"prompt": ["99+99=", "3+4="], "n": 2},
    {"prompt": "17+25=", "max_tokens": 1},
    {"prompt": "17+25=", "stop": "2"},
    {"prompt": "98+1=", "max_tokens": 2, "echo": True},
    {"prompt": "0+0=", "max_tokens": 0},
    {"prompt": "50+50=", "stop": ["0"], "max_tokens": 3},
]


class Held(Recorder):
    """A recording `complete` whose first call waits for `release`: a forward still running."""

    def __init__(self, complete: Any) -> None:
        super().__init__(complete)
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, prompts: list[str], **kwargs: Any) -> list[Completion]:
        if not self.calls:
            self.started.set()
            assert self.release.wait(60)
        return super().__call__(prompts, **kwargs)


def _answers(
    service: OpenAIService,
    bodies: list[dict[str, Any]],
    held: Held | None = None,
    waiting: int = 0,
    path: str = "/v1/completions",
) -> list[Any]:
    """Post every body at once (with `held`: the first alone, held in its forward until `waiting`
    requests wait for it); each answer as (status, choices, usage), (status, error code) or the
    streamed text."""

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=build_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as http:

            def post(body: dict[str, Any]) -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(http.post(path, json={"model": MODEL, **body}))

            if held is None:
                return list(await asyncio.gather(*(post(b) for b in bodies)))
            first = post(bodies[0])
            await asyncio.to_thread(held.started.wait, 60)
            rest = [post(b) for b in bodies[1:]]
            for _ in range(6000):  # in-loop work only: a few turns of the loop, however loaded the machine
                if service._waiting >= waiting:
                    break
                await asyncio.sleep(0.01)
            held.release.set()
            return [await first, *[await r for r in rest]]

    out = []
    for resp in asyncio.run(go()):
        if resp.headers["content-type"].startswith("text/event-stream"):
            chunks = [json.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
            out.append((resp.status_code, "".join(c["choices"][0]["text"] for c in chunks if c["choices"])))
            continue
        body = resp.json()
        if resp.status_code != 200:
            out.append((resp.status_code, body["error"]["code"]))
            continue
        texts = [c["text"] if "text" in c else c["message"]["content"] for c in body["choices"]]
        out.append((resp.status_code, [(t, c["finish_reason"]) for t, c in zip(texts, body["choices"], strict=True)],
                    body["usage"]))  # fmt: skip
    return out


def batching(complete: Any, pred: Predictor | None = None, **limits: Any) -> OpenAIService:
    from ray import serve

    stream = pred.stream if pred is not None else None
    return OpenAIService(complete, MODEL, 1, Limits(**limits), stream=stream, batch=serve.batch)


@pytest.mark.usefixtures("replica_context")
@pytest.mark.parametrize("model", ["untrained", "exact"])
def test_requests_arriving_during_a_forward_share_the_next_one_with_the_unbatched_answers(model: str) -> None:
    """With no batch wait (the default), a lone request is a batch of one at once; those that come
    while it runs form one batch as soon as it ends; every answer is what the unbatched service gives."""
    pred = predictor(model)
    expected = _answers(OpenAIService(pred.complete, MODEL, 1), BODIES)
    held = Held(pred.complete)
    service = batching(held, pred, max_batch_size=8)
    assert service._batched is not None and service._batched._get_batch_wait_timeout_s() == 0.0
    assert _answers(service, BODIES, held, waiting=len(BODIES) - 1) == expected
    # the first alone; then 4 + 1 + 1 + 1 + 1 + 1 rows in one call, padded to 16
    assert [len(p) for p, _ in held.calls] == [1, 16]


@pytest.mark.usefixtures("replica_context")
def test_requests_one_at_a_time_are_batches_of_one() -> None:
    calls = Recorder(predictor("exact").complete)
    service = batching(calls, max_batch_size=32)

    async def go() -> list[str]:  # one event loop, as in a replica: the batcher's queue lives in it
        transport = httpx.ASGITransport(app=build_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as http:
            out = []
            for prompt in ("17+25=", "3+4="):
                resp = await http.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
                out.append(resp.json()["choices"][0]["text"])
            return out

    assert asyncio.run(go()) == ["42", "7"]
    assert [len(p) for p, _ in calls.calls] == [1, 1]


@pytest.mark.usefixtures("replica_context")
def test_streams_and_sampled_requests_are_never_batched() -> None:
    pred = predictor("exact")
    held = Held(pred.complete)
    service = batching(held, pred, max_batch_size=2)
    bodies = [
        {"prompt": "1+1="},
        {"prompt": "3+4=", "stream": True},
        {"prompt": "5+5=", "temperature": 1.0, "seed": 1, "max_tokens": 1},
        {"prompt": "17+25="},
        {"prompt": "99+99="},
    ]
    out = _answers(service, bodies, held, waiting=2)
    assert [o[:2] for o in (out[0], out[3], out[4])] == [(200, [("2", "stop")]), (200, [("42", "stop")]),
                                                         (200, [("198", "stop")])]  # fmt: skip
    assert out[1] == (200, "7")  # the stream went through `stream`, token by token, not through the batch
    assert out[2][0] == 200
    sizes = sorted((len(p), kw["temperature"]) for p, kw in held.calls)
    assert sizes == [(1, 0.0), (1, 1.0), (2, 0.0)]  # the first; the sampled one alone; the two greedy together


@pytest.mark.usefixtures("replica_context")
def test_a_bad_prompt_in_a_batch_is_a_400_for_that_request_only() -> None:
    pred = predictor("exact")
    held = Held(pred.complete)
    service = batching(held, max_batch_size=4)
    bodies = [{"prompt": "1+1="}, {"prompt": "17+25="}, {"prompt": "1-1="}, {"prompt": "3+4=", "max_tokens": 1}]
    out = _answers(service, bodies, held, waiting=3)
    assert [o[:2] for o in out] == [(200, [("2", "stop")]), (200, [("42", "stop")]), (400, "invalid_prompt"),
                                    (200, [("7", "length")])]  # fmt: skip
    assert [len(p) for p, _ in held.calls] == [1, 4, 1, 1, 1]  # the first; the batch; then each of it alone


@pytest.mark.usefixtures("replica_context")
def test_batched_chat_completions_too() -> None:
    pred = predictor("exact")
    held = Held(pred.complete)
    service = batching(held, max_batch_size=4)
    bodies = [{"messages": [{"role": "user", "content": s}]} for s in ("1+1", "17+25", "3+4")]
    out = _answers(service, bodies, held, waiting=2, path="/v1/chat/completions")
    assert [o[:2] for o in out] == [(200, [("2", "stop")]), (200, [("42", "stop")]), (200, [("7", "stop")])]
    assert [len(p) for p, _ in held.calls] == [1, 2]


def test_batching_is_off_unless_asked_for() -> None:
    from ray import serve

    complete = predictor("exact").complete
    assert OpenAIService(complete, MODEL, 1, batch=serve.batch)._batched is None  # the default
    assert OpenAIService(complete, MODEL, 1, Limits(max_batch_size=1), batch=serve.batch)._batched is None
    assert OpenAIService(complete, MODEL, 1, Limits(max_batch_size=8))._batched is None  # no decorator given
    assert OpenAIService(complete, MODEL, 1, Limits(max_batch_size=8), batch=serve.batch)._batched is not None


def _replica(default_max_batch_size: int | None) -> tuple[Any, Any, Recorder]:
    """The Serve replica's class, and a stand-in for a loaded replica of it (CPU / single-host: None;
    multi-host: serve_app.MULTI_HOST_MAX_BATCH_SIZE) whose forward calls are recorded."""
    from addition.serve_app import AdditionCompletions

    cls = AdditionCompletions.func_or_class
    calls = Recorder(predictor("exact").complete)
    replica = types.SimpleNamespace(predictor=types.SimpleNamespace(complete=calls, stream=None), model_name=MODEL,
                                    created=1, default_max_batch_size=default_max_batch_size)  # fmt: skip
    replica._service = types.MethodType(cls._service, replica)
    replica._limits = types.MethodType(cls._limits, replica)
    return cls, replica, calls


def test_a_replica_batches_when_its_user_config_says_so() -> None:
    cls, replica, calls = _replica(None)
    assert cls._openai(replica)._batched is None  # off by default on a CPU or single-host replica
    cls.reconfigure(replica, {"max_batch_size": 16, "batch_wait_timeout_s": 0.002})
    # every batch size batching can bring (padded to powers of two) ran once, before the first request
    assert [(len(p), kw["max_new_tokens"]) for p, kw in calls.calls] == [(2, 1), (4, 1), (8, 1), (16, 1)]
    service = cls._openai(replica)
    assert service._batched is not None and service._batched._get_max_batch_size() == 16
    assert service._batched._get_batch_wait_timeout_s() == 0.002
    cls.reconfigure(replica, {"max_batch_size": 16})  # the default wait
    assert cls._openai(replica)._batched._get_batch_wait_timeout_s() == 0.0
    cls.reconfigure(replica, {"request_timeout_s": 30})
    assert cls._openai(replica)._batched is None
    assert len(calls.calls) == 8  # warmed again when batching came back on; not when it went off


def test_a_multi_host_replica_batches_unless_told_not_to() -> None:
    from addition.serve_app import MULTI_HOST_MAX_BATCH_SIZE

    cls, replica, calls = _replica(MULTI_HOST_MAX_BATCH_SIZE)
    service = cls._openai(replica)
    assert service._batched is not None and service._batched._get_max_batch_size() == 32
    assert [len(p) for p, _ in calls.calls] == [2, 4, 8, 16, 32]
    cls.reconfigure(replica, {"request_timeout_s": 30})  # other limits keep the default
    assert cls._openai(replica)._batched._get_max_batch_size() == 32
    cls.reconfigure(replica, {"max_batch_size": 1})
    assert cls._openai(replica)._batched is None


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"max_batch_size": 0}, ">= 1"),
        ({"max_batch_size": 2.5}, ">= 1"),
        ({"max_batch_size": 4, "batch_wait_timeout_s": -1}, ">= 0"),
        ({"max_batch_size": 4, "batch_wait_timeout_s": float("inf")}, ">= 0"),
        ({"batch_wait_timeout_s": 0.01}, "needs max_batch_size"),
    ],
)
def test_limits_refuse_bad_batching_config(config: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Limits.from_user_config(config)
    assert Limits.from_user_config({"max_batch_size": 4, "batch_wait_timeout_s": 0}).batching
