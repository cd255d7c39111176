"""An overloaded or failing Kubernetes API (429 with Retry-After, 500, 503) and dropped watches: the hooks
ride them out with the provider's retry, and nothing is created twice."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from kubernetes import watch

from tpuflow.kuberay import RAYCLUSTERS
from tpuflow_rehearsal.standins import kubernetes_api as standin_api

CONN = "kube_faults"


@pytest.fixture
def kube(standin: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in standin.connection_env(CONN).items():
        monkeypatch.setenv(key, value)
    return standin


def body(name: str) -> dict[str, Any]:
    head = {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": "ray"}]}}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {"headGroupSpec": head},
    }


def answered(kube: Any, method: str, plural: str) -> list[int]:
    return [code for m, path, code, _ in kube.api.requests if m == method and f"/{plural}" in path]


def test_a_429_then_a_500_are_retried_and_the_create_happens_once(kube: Any) -> None:
    from tpuflow.kuberay.hooks import KubeRayHook

    hook = KubeRayHook(conn_id=CONN)
    kube.api.add_fault(429, "POST", "rayclusters", retry_after=0)
    kube.api.add_fault(500, "POST", "rayclusters")
    hook.create(RAYCLUSTERS, body("once"), "default")
    assert answered(kube, "POST", "rayclusters") == [429, 500, 201]
    assert [c["metadata"]["name"] for c in kube.store.list(standin_api.RAYCLUSTERS)] == ["once"]

    kube.api.add_fault(503, "GET", "rayclusters", times=2)
    assert hook.get(RAYCLUSTERS, "once", "default")["metadata"]["name"] == "once"
    kube.api.add_fault(500, "PATCH", "rayclusters")
    patched = hook.patch(RAYCLUSTERS, "once", {"metadata": {"labels": {"a": "b"}}}, "default")
    assert patched["metadata"]["labels"]["a"] == "b" and answered(kube, "PATCH", "rayclusters") == [500, 200]
    assert kube.api.faults() == []


def test_the_triggers_async_reads_retry_too(kube: Any) -> None:
    from tpuflow.kuberay.hooks import AsyncKubeRayHook, KubeRayHook

    KubeRayHook(conn_id=CONN).create(RAYCLUSTERS, body("read"), "default")
    kube.api.add_fault(429, "GET", "rayclusters", times=2, retry_after=0)
    got = asyncio.run(AsyncKubeRayHook(conn_id=CONN).get(RAYCLUSTERS, "read", "default"))
    assert got is not None and got["metadata"]["name"] == "read"
    assert answered(kube, "GET", "rayclusters")[-3:] == [429, 429, 200]


def test_dropped_watches_end_and_a_new_watch_sees_the_changes(kube: Any) -> None:
    from tpuflow.kuberay.hooks import KubeRayHook

    hook = KubeRayHook(conn_id=CONN)
    api = hook.custom_object_client
    ended = threading.Event()

    def follow() -> None:
        for _ in watch.Watch().stream(api.list_namespaced_custom_object, "ray.io", "v1", "default", "rayclusters",
                                      timeout_seconds=60):  # fmt: skip
            pass
        ended.set()

    threading.Thread(target=follow, daemon=True).start()
    time.sleep(0.5)
    kube.api.drop_watches()
    assert ended.wait(5), "the watch did not end when the stand-in dropped it"
    hook.create(RAYCLUSTERS, body("after"), "default")
    events = watch.Watch().stream(api.list_namespaced_custom_object, "ray.io", "v1", "default", "rayclusters",
                                  timeout_seconds=2)  # fmt: skip
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in events]
    assert seen[0] == ("ADDED", "after") and {name for _, name in seen} == {"after"}, seen


def test_bad_fault_arguments_are_refused(kube: Any) -> None:
    with pytest.raises(ValueError, match="fault code 404"):
        kube.api.add_fault(404)
    with pytest.raises(ValueError, match="fault times 0"):
        kube.api.add_fault(500, times=0)
