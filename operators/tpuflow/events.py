"""The one shape of every tpuflow trigger event, and the one way an operator resumes from it.

Every trigger fires ``{"status": "success" | "failed" | "timeout" | "error", "message": str, ...}``
(plus fields of its own); every ``execute_complete`` starts with ``raise_for_event``.

- ``success``: the wait reached what it waited for.
- ``failed``: the resource says it failed (a job FAILED, an app DEPLOY_FAILED, a RayCluster whose
  pods cannot schedule). ``retryable`` False (the default) means a retry would fail the same way.
- ``timeout``: the deadline passed first.
- ``error``: the wait itself broke (API unreachable, an unexpected answer): worth a retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

EventStatus = Literal["success", "failed", "timeout", "error"]
STATUSES: frozenset[str] = frozenset({"success", "failed", "timeout", "error"})


class TriggerEventPayload(TypedDict):
    status: EventStatus
    message: str
    retryable: NotRequired[bool]
    diagnostics: NotRequired[str]


def make_event(status: EventStatus, message: str, **fields: Any) -> dict[str, Any]:
    """A plain-JSON event dict (what TriggerEvent carries)."""
    if status not in STATUSES:
        raise ValueError(f"trigger event status {status!r} is not one of {sorted(STATUSES)}")
    return {"status": status, "message": message, **fields}


def raise_for_event(event: Any, what: str) -> Mapping[str, Any]:
    """Return the event when it reports success; otherwise raise the task failure it stands for.

    ``failed`` that is not retryable raises AirflowFailException (no retry: the same input would
    fail again); ``timeout``, ``error`` and retryable failures raise AirflowException, so the
    task's retries apply. The message names ``what`` was waited for and carries the diagnostics.
    """
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    if not isinstance(event, Mapping) or event.get("status") not in STATUSES:
        raise AirflowException(f"{what}: unexpected trigger event {event!r}; clear the task to start over")
    status = event["status"]
    if status == "success":
        return event
    text = f"{what}: {status}: {event.get('message') or '(no message)'}"
    if event.get("diagnostics"):
        text += f"\n{event['diagnostics']}"
    if status == "failed" and not event.get("retryable", False):
        raise AirflowFailException(text)
    raise AirflowException(text)
