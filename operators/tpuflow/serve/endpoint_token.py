"""The optional bearer token of a Serve endpoint, on the Airflow side.

The token lives in an Airflow Connection (``serve_token_conn_id``; its password is the token). The deploy
operator hands each application only the token's SHA-256 digest (the ``token_sha256`` arg, which the
application checks with tpuflow_driver.endpoint_token); the smoke test sends the token itself as
``Authorization: Bearer <token>``. Neither ever logs it or puts it in XCom.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from airflow.sdk import BaseHook

from tpuflow.errors import UserInputError

TOKEN_ARG = "token_sha256"  # = tpuflow_driver.endpoint_token.ARG (the workloads are not importable here)


def serve_token(conn_id: str) -> str:
    """The token in Connection ``conn_id``'s password; a missing connection or empty password names the argument."""

    try:
        password = BaseHook.get_connection(conn_id).password
    except Exception as err:  # AirflowNotFoundException and the SDK's connection errors
        raise UserInputError(
            "serve_token_conn_id", conn_id, f"no such Airflow connection ({type(err).__name__}); create it"
        ) from None
    if not password:
        raise UserInputError(
            "serve_token_conn_id", conn_id, "the connection has no password: put the endpoint's bearer token there"
        )
    return str(password)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def with_token_digest(serve_config: dict[str, Any], digest: str) -> dict[str, Any]:
    """A copy of ``serve_config`` whose every application gets ``args.token_sha256 = digest``."""
    config = copy.deepcopy(serve_config)
    for app in config.get("applications") or []:
        app["args"] = {**(app.get("args") or {}), TOKEN_ARG: digest}
    return config


def bearer_header(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
