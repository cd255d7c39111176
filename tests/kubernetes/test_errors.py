"""Kubernetes API errors read one way: which are worth repeating, and what a failed call said, for the
synchronous and the asyncio client's ApiException alike."""

from __future__ import annotations

import json

import pytest
from aiohttp import ClientConnectionError
from kubernetes.client.exceptions import ApiException as SyncApiException
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException
from urllib3.exceptions import ProtocolError

from tpuflow.kubernetes.errors import CONFLICT, NOT_FOUND, api_error_parts, is_transient

CLIENTS = [SyncApiException, AsyncApiException]


@pytest.mark.parametrize("api_exception", CLIENTS)
@pytest.mark.parametrize("status", [429, 500, 503, CONFLICT])
def test_throttling_server_errors_and_read_conflicts_are_transient(api_exception: type[Exception], status: int) -> None:
    # 409 too, as the provider retries it (a read or patch racing a write); creates leave it out (hooks.py)
    assert is_transient(api_exception(status=status, reason="x"))


@pytest.mark.parametrize("api_exception", CLIENTS)
@pytest.mark.parametrize("status", [NOT_FOUND, 422, 403, 400])
def test_answers_about_the_request_are_final(api_exception: type[Exception], status: int) -> None:
    assert not is_transient(api_exception(status=status, reason="x"))


def test_dropped_connections_are_transient_and_other_errors_not() -> None:
    assert is_transient(ConnectionResetError("peer reset")) and is_transient(TimeoutError())
    assert is_transient(ProtocolError("Connection aborted.")) and is_transient(ClientConnectionError())
    assert not is_transient(ValueError("bad manifest")) and not is_transient(KeyError("spec"))


@pytest.mark.parametrize("api_exception", CLIENTS)
def test_api_error_parts_reads_the_status_body(api_exception: type[Exception]) -> None:
    err = api_exception(status=422, reason="Unprocessable Entity")
    err.body = json.dumps(  # type: ignore[attr-defined]
        {"kind": "Status", "reason": "Invalid", "message": 'RayCluster "r" is invalid: spec.x: Required value'}
    )
    assert api_error_parts(err) == (422, "Invalid", 'RayCluster "r" is invalid: spec.x: Required value')


@pytest.mark.parametrize("api_exception", CLIENTS)
def test_api_error_parts_falls_back_to_the_reason_and_raw_body(api_exception: type[Exception]) -> None:
    err = api_exception(status=409, reason="Conflict")
    err.body = "upstream connect error"  # type: ignore[attr-defined]
    assert api_error_parts(err) == (409, "Conflict", "upstream connect error")
    empty = api_exception(status=404, reason="Not Found")  # no body: the exception's own text
    code, reason, message = api_error_parts(empty)
    assert (code, reason) == (404, "Not Found") and "404" in message and "Not Found" in message


def test_api_error_parts_of_a_plain_exception() -> None:
    assert api_error_parts(RuntimeError("connection refused")) == (0, "", "connection refused")
