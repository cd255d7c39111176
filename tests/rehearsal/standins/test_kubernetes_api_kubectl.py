"""What kubectl needs from the Kubernetes stand-in, checked at the HTTP level (tests/cli drives kubectl itself):
TLS + token, discovery, OpenAPI v3, tables, watch, server-side apply and CRD field validation."""

from __future__ import annotations

import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from support.kuberay_crds import CRD_DIR

from tpuflow_rehearsal.standins.kubernetes_api import PODS, RAYCLUSTERS, KubernetesApiStandin

NS = "default"
RC = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters"


@pytest.fixture
def api() -> Iterator[KubernetesApiStandin]:
    with KubernetesApiStandin(crds=CRD_DIR) as standin:
        yield standin


def call(
    api: KubernetesApiStandin,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    accept: str = "application/json",
    token: bool = True,
) -> tuple[int, Any, dict[str, str]]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    headers = {"Content-Type": content_type, "Accept": accept}
    if token:
        headers["Authorization"] = f"Bearer {api.token}"
    request = urllib.request.Request(api.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=api.ssl_context()) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode(), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


def raycluster(name: str, **spec_extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray"}]}}},
            **spec_extra,
        },
    }


def test_tls_is_verified_against_the_kubeconfig_ca_and_the_token_is_required(api: KubernetesApiStandin) -> None:
    assert api.url.startswith("https://")
    kubeconfig = api.kubeconfig()
    assert kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"] == api.tls.ca_data  # type: ignore[union-attr]
    with pytest.raises(urllib.error.URLError) as untrusted:
        urllib.request.urlopen(api.url + "/version", timeout=5, context=ssl.create_default_context())
    assert "CERTIFICATE_VERIFY_FAILED" in str(untrusted.value)
    assert call(api, "GET", "/api/v1/namespaces/default/pods", token=False)[0] == 401
    assert call(api, "GET", "/version")[1]["gitVersion"].startswith("v1.33")


def test_discovery_publishes_short_names_categories_and_verbs(api: KubernetesApiStandin) -> None:
    core = {r["name"]: r for r in call(api, "GET", "/api/v1")[1]["resources"]}
    assert core["services"]["shortNames"] == ["svc"] and core["pods"]["shortNames"] == ["po"]
    assert "all" in core["pods"]["categories"] and "watch" in core["pods"]["verbs"]
    ray = {r["name"]: r for r in call(api, "GET", "/apis/ray.io/v1")[1]["resources"]}
    assert ray["rayclusters"]["categories"] == ["all"] and "patch" in ray["rayclusters"]["verbs"]


def test_openapi_v3_serves_the_crd_schema_and_the_field_validation_parameter(api: KubernetesApiStandin) -> None:
    index = call(api, "GET", "/openapi/v3")[1]["paths"]
    url = index["apis/ray.io/v1"]["serverRelativeURL"]
    doc = call(api, "GET", url)[1]
    patch = doc["paths"][f"{RC.replace(NS, '{namespace}')}/{{name}}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "ray.io", "version": "v1", "kind": "RayCluster"}
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]  # CRDs: merge patch
    schema = doc["components"]["schemas"]["io.ray.v1.RayCluster"]
    assert "workerGroupSpecs" in schema["properties"]["spec"]["properties"]


def test_field_validation_prunes_with_a_warning_refuses_when_strict_and_422s_a_bad_type(
    api: KubernetesApiStandin,
) -> None:
    code, obj, headers = call(api, "POST", RC, raycluster("warned", bogus=1))
    assert code == 201 and "bogus" not in obj["spec"] and 'unknown field \\"spec.bogus\\"' in headers["Warning"]
    code, status, _ = call(api, "POST", RC + "?fieldValidation=Strict", raycluster("strict", bogus=1))
    assert code == 400 and status["message"] == (
        'RayCluster in version "v1" cannot be handled as a RayCluster: strict decoding error: unknown field "spec.bogus"'
    )
    bad = raycluster("typed", workerGroupSpecs=[{"groupName": "w", "replicas": "two", "template": {}}])
    code, status, _ = call(api, "POST", RC + "?fieldValidation=Strict", bad)
    assert code == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.workerGroupSpecs[0].replicas"
    assert "must be of type integer" in status["message"]
    # The CRD's defaults are applied before validation, as the apiserver does.
    ok = raycluster("defaulted", workerGroupSpecs=[{"groupName": "w", "replicas": 1, "template": {}}])
    code, created, _ = call(api, "POST", RC + "?fieldValidation=Strict", ok)
    assert code == 201 and created["spec"]["workerGroupSpecs"][0]["minReplicas"] == 0


def test_server_side_apply_creates_updates_and_drops_what_the_manager_stopped_applying(
    api: KubernetesApiStandin,
) -> None:
    apply = RC + "/ssa?fieldManager=kubectl&fieldValidation=Strict"
    first = raycluster("ssa", suspend=True)
    first["metadata"]["labels"] = {"team": "a"}
    code, created, _ = call(
        api, "PATCH", apply, yaml.safe_dump(first).encode(), content_type="application/apply-patch+yaml"
    )
    assert code == 201 and created["spec"]["suspend"] is True
    assert [m["manager"] for m in created["metadata"]["managedFields"]] == ["kubectl"]
    second = raycluster("ssa", rayVersion="2.60.0")
    second["metadata"]["labels"] = {"team": "b"}
    code, updated, _ = call(
        api, "PATCH", apply, json.dumps(second).encode(), content_type="application/apply-patch+yaml"
    )
    assert code == 200 and updated["spec"]["rayVersion"] == "2.60.0" and "suspend" not in updated["spec"]
    assert updated["metadata"]["labels"] == {"team": "b"} and updated["metadata"]["generation"] == 2
    code, status, _ = call(api, "PATCH", RC + "/ssa", b"{}", content_type="application/apply-patch+yaml")
    assert code == 422 and "fieldManager: Required value" in status["message"]


def test_tables_carry_kuberays_printer_columns_and_the_pod_printer(api: KubernetesApiStandin) -> None:
    api.store.create(RAYCLUSTERS, NS, raycluster("t"))
    api.store.mutate(RAYCLUSTERS, NS, "t", lambda o: o.update(status={"desiredWorkerReplicas": 4, "state": "ready"}))
    table = call(api, "GET", RC, accept="application/json;as=Table;v=v1;g=meta.k8s.io,application/json")[1]
    assert table["kind"] == "Table"
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[:3] == ["Name", "desired workers", "available workers"] and "status" in names
    row = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert (row["Name"], row["desired workers"], row["status"]) == ("t", 4, "ready")
    assert row["age"].endswith("s") and table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    api.store.create(PODS, NS, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})
    api.store.mutate(
        PODS, NS, "p", lambda o: o.update(status={"phase": "Running", "containerStatuses": [{"ready": True}]})
    )
    pods = call(api, "GET", f"/api/v1/namespaces/{NS}/pods", accept="application/json;as=Table;v=v1;g=meta.k8s.io")[1]
    assert [c["name"] for c in pods["columnDefinitions"] if c["priority"] == 0] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    assert pods["rows"][0]["cells"][:4] == ["p", "1/1", "Running", 0]


def test_watch_streams_from_a_resource_version_until_deleted(api: KubernetesApiStandin) -> None:
    api.store.create(RAYCLUSTERS, NS, raycluster("w"))
    listed = call(api, "GET", RC + "?fieldSelector=metadata.name%3Dw")[1]
    since = listed["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []

    def watch() -> None:
        request = urllib.request.Request(
            f"{api.url}{RC}?watch=true&resourceVersion={since}&fieldSelector=metadata.name%3Dw&timeoutSeconds=20",
            headers={"Authorization": f"Bearer {api.token}"},
        )
        with urllib.request.urlopen(request, timeout=30, context=api.ssl_context()) as response:
            for line in response:
                events.append(json.loads(line))
                if events[-1]["type"] == "DELETED":
                    return

    reader = threading.Thread(target=watch)
    reader.start()
    api.store.create(RAYCLUSTERS, NS, raycluster("other"))  # not selected: never streamed
    api.store.mutate(RAYCLUSTERS, NS, "w", lambda o: o["metadata"].setdefault("labels", {}).update(seen="yes"))
    api.store.delete(RAYCLUSTERS, NS, "w")
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("MODIFIED", "w"), ("DELETED", "w")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(since)
