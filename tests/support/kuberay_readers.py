"""Readers for the KubeRay waits (tpuflow.kuberay.waits) in tests, which script only the objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class NothingToExplain:
    """What a wait reads to explain a verdict, empty: no pods, no events, no log lines, no RayClusters made for
    the object. A test's reader subclasses it and defines ``get`` (the objects the verdicts come from)."""

    async def objects(self, plural: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return []

    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return []

    async def events_for(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
        return []

    async def pod_log_tail(self, pod: str, namespace: str, lines: int, container: str | None = None) -> list[str]:
        return []


# A RayCluster as the waits read it: its head not ready yet, then ready (no workers wanted)
WAITING = {
    "metadata": {"name": "rc"},
    "status": {"conditions": [{"type": "HeadPodReady", "status": "False", "reason": "ContainersNotReady"}]},
}
READY = {
    "metadata": {"name": "rc"},
    "status": {
        "desiredWorkerReplicas": 0,
        "readyWorkerReplicas": 0,
        "conditions": [{"type": "RayClusterProvisioned", "status": "True"}, {"type": "HeadPodReady", "status": "True"}],
    },
}
