"""Why a RayCluster or RayService is not ready, in words: pods, Warning events, head pod log tail.

Pure functions over plain dicts (pods and events as the API returns them), shared by the synchronous
waits and the triggers; ``cluster_diagnostics`` gathers them for one RayCluster through a ``Reader``
(AsyncKubeRayHook in the triggerer, tpuflow.kuberay.waits.SyncReader in a worker).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from tpuflow.kuberay import CLUSTER_LABEL


class Reader(Protocol):
    """What the waits and the kinds' diagnoses read: custom objects (one, or those with some labels), pods, events,
    a pod's log tail."""

    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None: ...

    async def objects(self, plural: str, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    async def events_for(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]: ...

    async def pod_log_tail(self, pod: str, namespace: str, lines: int, container: str | None = None) -> list[str]: ...


def pod_problems(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    out = []
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        phase = status.get("phase", "Unknown")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if phase == "Running" and ready:
            continue
        reasons = []
        for cs in status.get("containerStatuses") or []:
            state = cs.get("state") or {}
            for kind in ("waiting", "terminated"):
                detail = state.get(kind) or {}
                if detail.get("reason"):
                    reasons.append(detail["reason"] + (f": {detail['message']}" if detail.get("message") else ""))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
                reasons.append(cond["reason"])
        out.append(
            f"pod {name} is {phase}{'' if phase != 'Running' else ' but not ready'}"
            + (f" ({'; '.join(dict.fromkeys(reasons))})" if reasons else "")
        )
    return out


def warning_events(events: Iterable[Mapping[str, Any]], limit: int = 8) -> list[str]:
    seen: dict[tuple[str, str], tuple[int, str]] = {}
    for ev in events:
        if ev.get("type") != "Warning":
            continue
        key = (str(ev.get("reason")), str(ev.get("message")))
        obj = (ev.get("involvedObject") or ev.get("involved_object") or {}).get("name", "")
        count = int(ev.get("count") or 1) + (seen[key][0] if key in seen else 0)
        seen[key] = (count, obj)
    lines = [f"{reason} (x{count}, e.g. {obj}): {message}" for (reason, message), (count, obj) in seen.items()]
    return lines[-limit:]


def render(
    headline: str,
    pods: Iterable[Mapping[str, Any]] = (),
    events: Iterable[Mapping[str, Any]] = (),
    head_log: Iterable[str] = (),
    head_pod: str | None = None,
) -> str:
    parts = [headline]
    problems = pod_problems(pods)
    if problems:
        parts.append(
            "Pods:\n  "
            + "\n  ".join(problems[:10])
            + (f"\n  ... {len(problems) - 10} more" if len(problems) > 10 else "")
        )
    warnings = warning_events(events)
    if warnings:
        parts.append("Warning events:\n  " + "\n  ".join(warnings))
    log = [line for line in head_log if line.strip()]
    if log:
        parts.append(f"Last {len(log)} log lines of head pod {head_pod or ''}:\n  " + "\n  ".join(log))
    return "\n".join(p for p in parts if p)


async def cluster_diagnostics(
    reader: Reader, cluster_name: str, namespace: str, headline: str, log_lines: int, extra_objects: Sequence[str] = ()
) -> str:
    """Pods, Warning events and the head pod's last log lines of one RayCluster, as text."""
    try:
        pods = await reader.pods(namespace, f"{CLUSTER_LABEL}={cluster_name}")
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
