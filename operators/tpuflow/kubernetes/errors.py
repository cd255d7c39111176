"""Kubernetes API errors, read the same way everywhere: which are transient (worth repeating, as the
cncf-kubernetes provider retries them) and what a failed call said. Cheap to import (no provider hooks)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import (
    TRANSIENT_CONNECTION_ERRORS,
    TRANSIENT_STATUS_CODES,
)
from kubernetes.client.exceptions import ApiException as SyncApiException
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

NOT_FOUND = 404
CONFLICT = 409

__all__ = ["CONFLICT", "NOT_FOUND", "api_error_parts", "is_transient"]


def is_transient(err: BaseException) -> bool:
    """Whether a failed API read is worth repeating: the clients' typed errors, as the provider retries them."""
    if isinstance(err, (SyncApiException, AsyncApiException)):
        return err.status in TRANSIENT_STATUS_CODES
    return isinstance(err, (*TRANSIENT_CONNECTION_ERRORS, ConnectionError, asyncio.TimeoutError))


def api_error_parts(exc: BaseException) -> tuple[int, str, str]:
    """(HTTP status, reason, message) of a client ApiException, from the Kubernetes Status body it carries."""
    code = int(getattr(exc, "status", 0) or 0)
    body: Any = getattr(exc, "body", None)
    reason, message = str(getattr(exc, "reason", "") or ""), str(body or exc)
    try:
        data = json.loads(body) if isinstance(body, (str, bytes)) else None
    except ValueError:
        data = None
    if isinstance(data, Mapping):
        reason = str(data.get("reason") or reason)
        message = str(data.get("message") or message)
    return code, reason, message
