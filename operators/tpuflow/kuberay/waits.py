"""Waiting on KubeRay objects: one implementation for the triggers and the non-deferrable path.

`wait_ready` / `wait_gone` are coroutines over a reader with async get / pods / events_for /
pod_log_tail (AsyncKubeRayHook in the triggerer; SyncReader wraps the synchronous hook for a worker
that does not defer). They return the tpuflow event shape (tpuflow.events), a ``KubeRayEvent``:

    {"status": "success" | "failed" | "timeout" | "error", "message": str, "kind", "name", "namespace",
     "diagnostics": str, "retryable"?: bool}

API errors the clients raise as transient (the cncf-kubernetes provider's own list: ApiException with
status 409/429/5xx, urllib3 / aiohttp connection errors) are retried until the deadline; any other
error ends the wait with ``error``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import (
    TRANSIENT_CONNECTION_ERRORS,
    TRANSIENT_STATUS_CODES,
)
from kubernetes.client.exceptions import ApiException as SyncApiException
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

from tpuflow.events import EventStatus, TriggerEventPayload, make_event
from tpuflow.kuberay import KIND_BY_PLURAL, RAYCLUSTERS
from tpuflow.kuberay.diagnostics import render
from tpuflow.kuberay.status import (
    Verdict,
    raycluster_verdict,
    rayservice_verdict,
    service_cluster_name,
    stuck_service_diagnosis,
)

KINDS = {kind: plural for plural, kind in KIND_BY_PLURAL.items()}


class KubeRayEvent(TriggerEventPayload):
    """What the KubeRay waits (and so their triggers) fire."""

    kind: str
    name: str
    namespace: str


class Reader(Protocol):
    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None: ...

    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    async def events_for(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]: ...

    async def pod_log_tail(self, pod: str, namespace: str, lines: int, container: str | None = None) -> list[str]: ...


class SyncReader:
    """Reader over the synchronous KubeRayHook (blocking calls; used only outside the triggerer)."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        return self.hook.get(plural, name, namespace)  # type: ignore[no-any-return]

    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self.hook.pods(namespace, label_selector)  # type: ignore[no-any-return]

    async def events_for(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
        return self.hook.events_for(namespace, names)  # type: ignore[no-any-return]

    async def pod_log_tail(self, pod: str, namespace: str, lines: int, container: str | None = None) -> list[str]:
        return self.hook.pod_log_tail(pod, namespace, lines, container)  # type: ignore[no-any-return]


def kuberay_event(
    status: EventStatus, kind: str, name: str, namespace: str, message: str, diagnostics: str = "", **fields: Any
) -> KubeRayEvent:
    return cast(
        KubeRayEvent,
        make_event(status, message, kind=kind, name=name, namespace=namespace, diagnostics=diagnostics, **fields),
    )


def is_transient(err: BaseException) -> bool:
    """Whether a failed API read is worth repeating: the clients' typed errors, as the provider retries them."""
    if isinstance(err, (SyncApiException, AsyncApiException)):
        return err.status in TRANSIENT_STATUS_CODES
    return isinstance(err, (*TRANSIENT_CONNECTION_ERRORS, ConnectionError, asyncio.TimeoutError))


async def cluster_diagnostics(
    reader: Reader, cluster_name: str, namespace: str, headline: str, log_lines: int, extra_objects: Sequence[str] = ()
) -> str:
    """Pods, Warning events and the head pod's last log lines of one RayCluster, as text."""
    try:
        pods = await reader.pods(namespace, f"ray.io/cluster={cluster_name}")
        names = [cluster_name, *extra_objects, *((p.get("metadata") or {}).get("name", "") for p in pods)]
        events = await reader.events_for(namespace, names)
        head = next(
            (p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get("ray.io/node-type") == "head"), None
        )
        head_name = (head or {}).get("metadata", {}).get("name")
        container = (((head or {}).get("spec") or {}).get("containers") or [{}])[0].get("name")
        log = await reader.pod_log_tail(head_name, namespace, log_lines, container) if head_name else []
    except Exception as err:  # diagnostics are best effort: never hide the real failure behind them
        return f"{headline}\n(could not collect diagnostics: {type(err).__name__}: {err})"
    return render(headline, pods, events, log, head_name)


async def _verdict(reader: Reader, kind: str, name: str, namespace: str) -> tuple[Verdict, dict[str, Any] | None]:
    obj = await reader.get(KINDS[kind], name, namespace)
    if obj is None:
        return Verdict("failed", f"{kind} {namespace}/{name} no longer exists (deleted while waiting)"), None
    verdict = raycluster_verdict(obj) if kind == "RayCluster" else rayservice_verdict(obj)
    return verdict, obj


async def _explain(
    reader: Reader, kind: str, name: str, namespace: str, obj: Mapping[str, Any] | None, timed_out: bool, log_lines: int
) -> str:
    if obj is None:
        return ""
    if kind == "RayCluster":
        return await cluster_diagnostics(reader, name, namespace, "", log_lines)
    cluster = service_cluster_name(obj)
    cluster_reason = None
    if cluster:
        cluster_obj = await reader.get(RAYCLUSTERS, cluster, namespace)
        cluster_reason = raycluster_verdict(cluster_obj).reason if cluster_obj else None
    headline = ""
    if timed_out:
        headline = "Stuck: " + stuck_service_diagnosis(obj, cluster_reason)
    if not cluster:
        return (headline + "\n" if headline else "") + "(KubeRay has not created the RayService's RayCluster)"
    return await cluster_diagnostics(reader, cluster, namespace, headline, log_lines, extra_objects=(name,))


def _read_failed(kind: str, name: str, namespace: str, err: BaseException) -> KubeRayEvent:
    return kuberay_event(
        "error", kind, name, namespace, f"reading {kind} {namespace}/{name} failed: {type(err).__name__}: {err}"
    )


async def wait_ready(
    reader: Reader, *, kind: str, name: str, namespace: str, deadline: float, poll_interval: float, log_lines: int = 50
) -> KubeRayEvent:
    """Poll until ready (KubeRay semantics), failed (fail fast) or the deadline (epoch seconds)."""
    last_error = ""
    verdict, obj = Verdict("waiting", "not polled yet"), None
    while True:
        try:
            verdict, obj = await _verdict(reader, kind, name, namespace)
            last_error = ""
        except Exception as err:
            if not is_transient(err):
                return _read_failed(kind, name, namespace, err)
            last_error = f"{type(err).__name__}: {err}"
        if verdict.ready:
            return kuberay_event("success", kind, name, namespace, verdict.reason)
        if verdict.failed:
            diag = await _explain(reader, kind, name, namespace, obj, False, log_lines)
            # An object that disappeared (deleted while waiting) is recreated by a retry; a failure KubeRay reports is not.
            return kuberay_event("failed", kind, name, namespace, verdict.reason, diag, retryable=obj is None)
        remaining = deadline - time.time()
        if remaining <= 0:
            diag = await _explain(reader, kind, name, namespace, obj, True, log_lines)
            note = f" (last API error: {last_error})" if last_error else ""
            return kuberay_event(
                "timeout",
                kind,
                name,
                namespace,
                f"{kind} {namespace}/{name} not ready by the deadline: {verdict.reason}{note}",
                diag,
            )
        await asyncio.sleep(min(poll_interval, max(remaining, 0.01)))


async def wait_gone(
    reader: Reader, *, kind: str, name: str, namespace: str, deadline: float, poll_interval: float
) -> KubeRayEvent:
    """Poll until the object no longer exists, or the deadline."""
    obj: dict[str, Any] | None = None
    while True:
        try:
            obj = await reader.get(KINDS[kind], name, namespace)
        except Exception as err:
            if not is_transient(err):
                return _read_failed(kind, name, namespace, err)
        else:
            if obj is None:
                return kuberay_event("success", kind, name, namespace, f"{kind} {namespace}/{name} is gone")
        if time.time() >= deadline:
            meta = (obj or {}).get("metadata") or {}
            finalizers = ", ".join(meta.get("finalizers") or []) or "none"
            return kuberay_event(
                "timeout",
                kind,
                name,
                namespace,
                f"{kind} {namespace}/{name} still exists at the deadline (deletionTimestamp="
                f"{meta.get('deletionTimestamp')}, finalizers: {finalizers}); the KubeRay operator "
                "may be down or a finalizer is stuck",
            )
        await asyncio.sleep(min(poll_interval, max(deadline - time.time(), 0.01)))
