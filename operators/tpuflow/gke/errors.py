"""Sort GKE API failures into what to do next, and say it in words a DAG author can act on.

Works on plain values (HTTP code, status name, message, status-condition codes) so it is shared by
the hook, the operators and the tests without importing google-cloud. The message shapes are GKE's
and Compute Engine's own, e.g. "[GCE_STOCKOUT]: Instance ... creation failed: The zone ... does not
have enough resources available", "Quota 'TPUS_PER_TPU_FAMILY' exceeded", and the 429 "Too many
operations: cluster "c" hits the concurrent operations quota 5".
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


class FailureKind(enum.StrEnum):
    STOCKOUT = "stockout"  # no capacity now: next capacity choice, or retry with backoff
    QUOTA = "quota"  # the project's quota is too small: fail, name the quota
    TOO_MANY_OPERATIONS = "too_many_operations"  # the cluster is busy: wait and retry
    TRANSIENT = "transient"  # 5xx / unavailable: wait and retry
    ALREADY_EXISTS = "already_exists"
    NOT_FOUND = "not_found"
    PERMISSION = "permission"  # fail at once
    INVALID_ARGUMENT = "invalid_argument"  # fail at once
    UNKNOWN = "unknown"

    @property
    def wait_and_retry(self) -> bool:
        return self in (FailureKind.TOO_MANY_OPERATIONS, FailureKind.TRANSIENT)


# google.rpc.Code numbers, as found in Operation.error.code.
_RPC_CODES = {
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    16: "UNAUTHENTICATED",
}

_STOCKOUT_RE = re.compile(
    r"GCE_STOCKOUT|ZONE_RESOURCE_POOL_EXHAUSTED|RESOURCE_POOL_EXHAUSTED|STOCKOUT|"
    r"does not have enough resources available|no more capacity in the zone",
    re.IGNORECASE,
)
_BUSY_RE = re.compile(
    r"too many operations|concurrent operations quota|is currently \w+ing .*please wait and try again",
    re.IGNORECASE | re.DOTALL,
)
_QUOTA_RE = re.compile(r"GCE_QUOTA_EXCEEDED|QUOTA_EXCEEDED|Quota '[^']+' exceeded|insufficient (\w+ )?quota", re.I)
_QUOTA_NAME_RES = (
    re.compile(r"Quota '([^']+)' exceeded"),
    re.compile(r"resource \"([^\"]+)\""),
    re.compile(r"quota metric '([^']+)'", re.IGNORECASE),
)


@dataclass(frozen=True)
class GKEFailure:
    kind: FailureKind
    message: str  # what GKE said
    quota: str | None = None
    status: str | None = None

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"


def _quota_name(text: str) -> str | None:
    for pattern in _QUOTA_NAME_RES:
        m = pattern.search(text)
        if m:
            return m.group(1)
    return None


def classify(
    *,
    http_code: int | None = None,
    status: str | None = None,
    message: str = "",
    condition_codes: Iterable[str] = (),
) -> GKEFailure:
    codes = {c.upper() for c in condition_codes if c}
    status = (status or "").upper() or None
    text = message or ""
    if "GCE_STOCKOUT" in codes or _STOCKOUT_RE.search(text):
        return GKEFailure(FailureKind.STOCKOUT, text, status=status)
    # Before the quota test: the busy message says "concurrent operations quota".
    if _BUSY_RE.search(text):
        return GKEFailure(FailureKind.TOO_MANY_OPERATIONS, text, status=status)
    if "GCE_QUOTA_EXCEEDED" in codes or _QUOTA_RE.search(text):
        return GKEFailure(FailureKind.QUOTA, text, quota=_quota_name(text), status=status)
    if http_code == 409 or status == "ALREADY_EXISTS":
        return GKEFailure(FailureKind.ALREADY_EXISTS, text, status=status)
    if http_code == 404 or status == "NOT_FOUND":
        return GKEFailure(FailureKind.NOT_FOUND, text, status=status)
    if http_code in (401, 403) or status in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
        return GKEFailure(FailureKind.PERMISSION, text, status=status)
    if http_code == 400 or status in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"):
        return GKEFailure(FailureKind.INVALID_ARGUMENT, text, status=status)
    if http_code in (429, 500, 502, 503, 504) or status in (
        "RESOURCE_EXHAUSTED",
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "INTERNAL",
        "ABORTED",
    ):
        return GKEFailure(FailureKind.TRANSIENT, text, status=status)
    return GKEFailure(FailureKind.UNKNOWN, text, status=status)


def classify_exception(exc: BaseException) -> GKEFailure:
    """A google.api_core exception (HTTP or gRPC) from a GKE call."""
    code = getattr(exc, "code", None)
    http_code = code if isinstance(code, int) else None
    grpc_code = getattr(exc, "grpc_status_code", None)
    status = getattr(grpc_code, "name", None)
    message = getattr(exc, "message", None) or str(exc)
    reasons = [getattr(exc, "reason", None) or ""]
    return classify(http_code=http_code, status=status, message=message, condition_codes=reasons)


def classify_operation(operation: dict[str, Any]) -> GKEFailure | None:
    """A finished Operation in REST JSON form; None when it succeeded."""
    error = operation.get("error") or {}
    conditions = list(operation.get("nodepoolConditions") or []) + list(operation.get("clusterConditions") or [])
    if not error and not conditions:
        return None
    texts = [error.get("message", ""), operation.get("detail", ""), operation.get("statusMessage", "")]
    texts += [c.get("message", "") for c in conditions]
    texts = list(dict.fromkeys(t for t in texts if t))
    # GKE repeats the instance error inside the IGM summary; keep only the most complete text.
    message = " | ".join(t for t in texts if not any(t != other and t in other for other in texts))
    code = error.get("code")
    status = _RPC_CODES.get(code) if isinstance(code, int) else None
    codes = [str(c.get("code", "")) for c in conditions]
    return classify(status=status, message=message, condition_codes=codes)


def explain(
    failure: GKEFailure,
    *,
    action: str,
    what: str,
    project_id: str,
    location: str,
    cluster_name: str,
    zone: str = "",
    tried: Iterable[str] = (),
) -> str:
    """A failure message that says what happened and what to do about it."""
    said = f"GKE said: {failure.message}" if failure.message else ""
    cluster = f"cluster {cluster_name} ({project_id}, {location})"
    kind = failure.kind
    if kind is FailureKind.STOCKOUT:
        tried_list = ", ".join(dict.fromkeys(tried)) or "the requested capacity"
        return (
            f"No capacity for {what} in zone {zone or location} (tried {tried_list}). Try another zone that offers "
            "this TPU, a reservation (capacity='reservation:NAME'), flex-start, a fallback_capacity list, or run "
            f"again later. {said}"
        )
    if kind is FailureKind.QUOTA:
        quota = failure.quota or "(quota name not given by GKE)"
        return (
            f"Quota {quota} is too small to {action} {what} in {zone or location}. Request more of {quota} for "
            f"project {project_id} (Cloud console > IAM & Admin > Quotas), or ask for fewer/smaller slices. {said}"
        )
    if kind is FailureKind.TOO_MANY_OPERATIONS:
        return (
            f"{cluster} kept refusing new operations (GKE runs only a few at a time per cluster). Wait for running "
            f"upgrades/node pool changes to finish, or raise max_busy_retries. {said}"
        )
    if kind is FailureKind.PERMISSION:
        return (
            f"The Airflow connection's identity may not {action} node pools in {cluster}. Grant it "
            f"roles/container.admin (or container.clusters.update and container.operations.get) on {project_id}, "
            f"and roles/iam.serviceAccountUser on the node service account. {said}"
        )
    if kind is FailureKind.NOT_FOUND:
        return f"{cluster} was not found. Check project_id, location and cluster_name. {said}"
    if kind is FailureKind.INVALID_ARGUMENT:
        return (
            f"GKE rejected the request to {action} {what} in {cluster}. Compare the request with "
            f"`tpuflow render nodepool ...` and the GKE TPU docs. {said}"
        )
    return f"Could not {action} {what} in {cluster}: {failure}"
