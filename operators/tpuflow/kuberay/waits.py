"""Waiting on KubeRay objects: one implementation for the triggers and the non-deferrable path.

`wait_ready` / `wait_gone` are coroutines over a reader with async get / pods / events_for /
pod_log_tail (AsyncKubeRayHook in the triggerer; SyncReader wraps the synchronous hook for a worker
that does not defer). A wait names its object's kind (tpuflow.kuberay.kinds: its plural, status verdict and
diagnosis); they return the tpuflow event shape (tpuflow.events), a ``KubeRayEvent``:

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
from typing import Any, cast

from tpuflow.events import EventStatus, TriggerEventPayload, make_event
from tpuflow.kuberay import CLUSTER_LABEL, RAYCLUSTERS
from tpuflow.kuberay.diagnostics import Reader
from tpuflow.kuberay.kinds import KubeRayKind, kind_named
from tpuflow.kuberay.status import Verdict
from tpuflow.kubernetes.errors import is_transient
from tpuflow.polling import poll_delays


class KubeRayEvent(TriggerEventPayload):
    """What the KubeRay waits (and so their triggers) fire."""

    kind: str
    name: str
    namespace: str


class SyncReader:
    """Reader over the synchronous KubeRayHook (blocking calls; used only outside the triggerer)."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        return self.hook.get(plural, name, namespace)  # type: ignore[no-any-return]

    async def objects(self, plural: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self.hook.objects(plural, namespace, label_selector)  # type: ignore[no-any-return]

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


async def _verdict(
    reader: Reader, kind: type[KubeRayKind], name: str, namespace: str
) -> tuple[Verdict, dict[str, Any] | None]:
    obj = await reader.get(kind.plural, name, namespace)
    if obj is None:
        return Verdict("failed", f"{kind.name} {namespace}/{name} no longer exists (deleted while waiting)"), None
    return kind.verdict(obj), obj


async def _explain(
    reader: Reader,
    kind: type[KubeRayKind],
    name: str,
    namespace: str,
    obj: Mapping[str, Any] | None,
    timed_out: bool,
    log_lines: int,
) -> str:
    if obj is None:
        return ""
    return await kind.diagnosis(reader, obj, name=name, namespace=namespace, timed_out=timed_out, log_lines=log_lines)


def _read_failed(kind: str, name: str, namespace: str, err: BaseException) -> KubeRayEvent:
    return kuberay_event(
        "error", kind, name, namespace, f"reading {kind} {namespace}/{name} failed: {type(err).__name__}: {err}"
    )


async def wait_ready(
    reader: Reader, *, kind: str, name: str, namespace: str, deadline: float, poll_interval: float, log_lines: int = 50
) -> KubeRayEvent:
    """Poll until ready (the kind's verdict), failed (fail fast) or the deadline (epoch seconds)."""
    of_kind = kind_named(kind)
    last_error = ""
    verdict, obj = Verdict("waiting", "not polled yet"), None
    delays = poll_delays(poll_interval)
    while True:
        try:
            verdict, obj = await _verdict(reader, of_kind, name, namespace)
            last_error = ""
        except Exception as err:
            if not is_transient(err):
                return _read_failed(kind, name, namespace, err)
            last_error = f"{type(err).__name__}: {err}"
        if verdict.ready:
            return kuberay_event("success", kind, name, namespace, verdict.reason)
        if verdict.failed:
            diag = await _explain(reader, of_kind, name, namespace, obj, False, log_lines)
            # An object that disappeared (deleted while waiting) is recreated by a retry; a failure KubeRay reports is not.
            return kuberay_event("failed", kind, name, namespace, verdict.reason, diag, retryable=obj is None)
        remaining = deadline - time.time()
        if remaining <= 0:
            diag = await _explain(reader, of_kind, name, namespace, obj, True, log_lines)
            note = f" (last API error: {last_error})" if last_error else ""
            return kuberay_event(
                "timeout",
                kind,
                name,
                namespace,
                f"{kind} {namespace}/{name} not ready by the deadline: {verdict.reason}{note}",
                diag,
            )
        await asyncio.sleep(min(next(delays), max(remaining, 0.01)))


async def _clusters_left(
    reader: Reader, kind: type[KubeRayKind], name: str, namespace: str, seen: set[str]
) -> list[str]:
    """What is left of the RayClusters KubeRay made for the object ``name`` (its kind's ``clusters_selector``):
    those still listed and the pods of every one seen so far (``seen``, added to), in words; [] when none."""
    selector = kind.clusters_selector(name)
    if selector is None:
        return []
    clusters = [str(c["metadata"]["name"]) for c in await reader.objects(RAYCLUSTERS, namespace, selector)]
    seen.update(clusters)
    pods = await reader.pods(namespace, f"{CLUSTER_LABEL} in ({','.join(sorted(seen))})") if seen else []
    return [f"RayCluster {c}" for c in clusters] + [f"pod {p['metadata']['name']}" for p in pods]


async def wait_gone(
    reader: Reader,
    *,
    kind: str,
    name: str,
    namespace: str,
    deadline: float,
    poll_interval: float,
    clusters: Sequence[str] = (),
) -> KubeRayEvent:
    """Poll until the object no longer exists, nor the RayClusters KubeRay made for it and their pods (``clusters``:
    their names read before the delete; those listed while waiting are added), or the deadline."""
    of_kind = kind_named(kind)
    obj: dict[str, Any] | None = None
    seen: set[str] = set(clusters)
    left: list[str] | None = None  # what is left of it once it is gone itself; None until then
    last_error = ""
    delays = poll_delays(poll_interval)
    while True:
        try:
            obj = await reader.get(of_kind.plural, name, namespace)
            left = None if obj is not None else await _clusters_left(reader, of_kind, name, namespace, seen)
            last_error = ""
        except Exception as err:
            if not is_transient(err):
                return _read_failed(kind, name, namespace, err)
            last_error = f"{type(err).__name__}: {err}"
        else:
            if obj is None and not left:
                return kuberay_event("success", kind, name, namespace, f"{kind} {namespace}/{name} is gone")
        if time.time() >= deadline:
            note = f" (last API error: {last_error})" if last_error else ""
            message = _still_there(kind, name, namespace, obj, left) + note
            return kuberay_event("timeout", kind, name, namespace, message)
        await asyncio.sleep(min(next(delays), max(deadline - time.time(), 0.01)))


def _still_there(
    kind: str, name: str, namespace: str, obj: Mapping[str, Any] | None, left: Sequence[str] | None
) -> str:
    """What a delete's wait found at its deadline, and its likely cause."""
    if obj is None and left:
        return (
            f"{kind} {namespace}/{name} is gone, but what KubeRay made for it is not at the deadline: "
            f"{', '.join(left)}; their pods may still be terminating (their node may be gone or unreachable)"
        )
    meta = (obj or {}).get("metadata") or {}
    finalizers = ", ".join(meta.get("finalizers") or []) or "none"
    return (
        f"{kind} {namespace}/{name} still exists at the deadline (deletionTimestamp="
        f"{meta.get('deletionTimestamp')}, finalizers: {finalizers}); "
        + (
            "its pods are still terminating (their node may be gone or unreachable)"
            if finalizers == "foregroundDeletion"
            else "the KubeRay operator may be down or a finalizer is stuck"
        )
    )
