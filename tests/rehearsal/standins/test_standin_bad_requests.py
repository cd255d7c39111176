"""The stand-ins answer a malformed request as the real APIs do (400/422 naming the problem), never with a 500
or by storing what the real server would refuse."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
from tpuflow_rehearsal.standins.kubernetes_api import CORE_TYPES, KubernetesApiStandin


def _send(url: str, method: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def kube() -> Iterator[KubernetesApiStandin]:
    api = KubernetesApiStandin(tls=False, require_token=False).start()
    yield api
    api.stop()


@pytest.fixture(scope="module")
def gke() -> Iterator[tuple[GKEApiStandin, str]]:
    standin = GKEApiStandin(operation_seconds=0, clusters=["projects/p1/locations/us-east5-b/clusters/c1"])
    url = standin.start()
    yield standin, url
    standin.stop()


@pytest.mark.parametrize(
    ("path", "meta", "field"),
    [
        ("/api/v1/namespaces/default/configmaps", {"name": "Bad_Name"}, "metadata.name"),
        ("/api/v1/namespaces/default/configmaps", {"name": 5}, "metadata.name"),
        ("/api/v1/namespaces/default/configmaps", {"name": "x" * 254}, "metadata.name"),
        ("/api/v1/namespaces/Bad_NS/configmaps", {"name": "ok"}, "metadata.namespace"),
    ],
)
def test_kubernetes_rejects_bad_object_names(
    kube: KubernetesApiStandin, path: str, meta: dict[str, Any], field: str
) -> None:
    code, status = _send(kube._http.url + path, "POST", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})
    assert code == 422, status
    assert status["reason"] == "Invalid" and field in status["message"]
    assert [o["metadata"]["name"] for o in kube.store.list(CORE_TYPES["configmaps"])] in ([], ["pod.17a3f"])


def test_kubernetes_accepts_dotted_names(kube: KubernetesApiStandin) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pod.17a3f"}}
    code, _ = _send(kube._http.url + "/api/v1/namespaces/default/configmaps", "POST", body)
    assert code == 201


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/_standin/faults", [1]),
        ("/_standin/config", {"operationSeconds": "nan"}),
        ("/_standin/config", {"operationSeconds": -1}),
    ],
)
def test_gke_control_requests_are_checked(gke: tuple[GKEApiStandin, str], path: str, body: Any) -> None:
    standin, url = gke
    code, answer = _send(url + path, "POST", body)
    assert code == 400, answer
    assert answer["error"]["status"] == "INVALID_ARGUMENT"
    assert standin.operation_seconds == 0
