"""ServeEndpointSmokeTestOperator against a loopback endpoint: patient while it is not serving, quick on a
wrong answer."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from support.airflow_context import task_context
from support.loopback_endpoint import LoopbackEndpoint

from tpuflow.serve.operators import RayServeDeploymentFailedError, ServeEndpointSmokeTestOperator

PAYLOAD = {"model": "addition", "prompt": "17+25=", "max_tokens": 4, "temperature": 0}


class Endpoint(LoopbackEndpoint):
    """Answers each POST with the next of `answers` (status, text); the last one repeats."""

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        super().__init__(lambda headers, body: answers[min(len(self.requests), len(answers)) - 1])

    @property
    def bodies(self) -> list[Any]:
        return [json.loads(body) for _, body in self.requests]


@pytest.fixture
def endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    with Endpoint(request.param) as ep:
        yield ep


def smoke(url: str, timeout: float = 30.0) -> ServeEndpointSmokeTestOperator:
    return ServeEndpointSmokeTestOperator(task_id="smoke_test", url=url, payload=PAYLOAD, expect="42", timeout=timeout)


ANSWER = json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": "42"}]})
WRONG = json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": "43"}]})


@pytest.mark.parametrize(
    "endpoint",
    [[(404, "Path '/addition' not found"), (503, "no replica"), (429, "busy"), (200, ANSWER)]],
    indirect=True,
)
def test_an_endpoint_not_serving_yet_is_asked_again_until_it_answers(endpoint: Endpoint) -> None:
    answer = smoke(endpoint.url).execute(task_context())
    assert answer["choices"][0]["text"] == "42"
    assert len(endpoint.bodies) == 4 and endpoint.bodies[-1] == PAYLOAD


@pytest.mark.parametrize("endpoint", [[(200, "17+25=42")]], indirect=True)
def test_a_plain_text_answer_passes_at_once_and_is_returned_as_text(endpoint: Endpoint) -> None:
    started = time.monotonic()
    assert smoke(endpoint.url, timeout=60).execute(task_context()) == "17+25=42"
    assert len(endpoint.bodies) == 1 and time.monotonic() - started < 30


@pytest.mark.parametrize("endpoint", [[(200, WRONG)]], indirect=True)
def test_a_wrong_answer_fails_at_once_with_the_answer(endpoint: Endpoint) -> None:
    started = time.monotonic()
    with pytest.raises(RayServeDeploymentFailedError, match=r"without '42': 200: .*\"43\""):
        smoke(endpoint.url, timeout=120).execute(task_context())
    assert len(endpoint.bodies) == 1 and time.monotonic() - started < 30


@pytest.mark.parametrize("endpoint", [[(400, '{"error": "bad prompt"}')]], indirect=True)
def test_a_client_error_fails_at_once(endpoint: Endpoint) -> None:
    with pytest.raises(RayServeDeploymentFailedError, match="400: .*bad prompt"):
        smoke(endpoint.url, timeout=120).execute(task_context())
    assert len(endpoint.bodies) == 1


def test_an_endpoint_that_never_answers_fails_at_the_timeout_naming_the_last_error() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()  # a free port nobody listens on: connection refused
    with pytest.raises(RayServeDeploymentFailedError, match=r"did not answer with '42' within 3s; last: .*[Rr]efused"):
        smoke(f"http://127.0.0.1:{port}/addition/v1/completions", timeout=3).execute(task_context())
