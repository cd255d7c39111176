"""The real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the KubeRay operator
built from Go modules) starts on loopback, answers only its clients, runs the real operator on our RayCluster,
collects owned objects when their owner goes, and stops with nothing left."""

from __future__ import annotations

import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from support.polling import until

from tpuflow_rehearsal.controlplane import binaries
from tpuflow_rehearsal.controlplane.cluster import ControlPlane
from tpuflow_rehearsal.nodes.kube_rest import KubeError, KubeRest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("controlplane"), bins=binaries.ensure()) as running:
        yield running


def rest(plane: ControlPlane, user: str = "admin") -> KubeRest:
    return KubeRest(plane.url, plane.token(user), str(plane.paths["ca_cert"]))


def wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    """``check()`` until it is truthy; fails naming ``what`` and the last value."""
    value = until(check, timeout=timeout)
    assert value, f"timed out waiting for {what} (last: {value!r})"
    return value


def raycluster(name: str) -> dict[str, Any]:
    from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest
    from tpuflow.tpu import TpuSlice

    template = RayClusterTemplate(
        TpuSlice.from_spec("v6e", "2x4", "ct6e-standard-4t"), image="rayproject/ray:2.60.0-py311", auth_mode="disabled"
    )
    return raycluster_manifest(template.validated(), name=name)


def test_a_pod_can_be_made_the_moment_the_plane_has_started(plane: ControlPlane) -> None:
    """The first test on the module's plane: its start waited for the default ServiceAccount, without which the
    API server refuses every pod of the namespace (a run started right after the plane came up got "serviceaccount
    "default" not found")."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "first-pod"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}]},
    }
    made = rest(plane).request("POST", "/api/v1/namespaces/default/pods", pod)
    assert made["spec"]["serviceAccountName"] == "default"
    rest(plane).request("DELETE", "/api/v1/namespaces/default/pods/first-pod")


def test_the_binaries_are_the_pinned_releases(plane: ControlPlane) -> None:
    version = rest(plane).request("GET", "/version")
    assert version["gitVersion"] == "v1.36.3" and version["minor"] == "36"
    crd = rest(plane).request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayclusters.ray.io")
    assert crd["metadata"]["annotations"]["controller-gen.kubebuilder.io/version"]  # KubeRay's own CRD


def test_only_known_clients_get_in_and_rbac_limits_them(plane: ControlPlane) -> None:
    context = ssl.create_default_context(cafile=str(plane.paths["ca_cert"]))
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{plane.url}/api/v1/namespaces", context=context, timeout=5)
    assert anonymous.value.code == 401
    with pytest.raises(KubeError) as forbidden:  # KubeRay's own ClusterRole touches no RBAC objects
        rest(plane, "kuberay-operator").request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles")
    assert forbidden.value.status == 403
    assert rest(plane, "kuberay-operator").items("/apis/ray.io/v1/rayclusters") == []


def test_the_real_operator_reconciles_our_raycluster_and_gc_collects_it(plane: ControlPlane) -> None:
    api = rest(plane)
    wait_for("the default service account", lambda: api.items("/api/v1/namespaces/default/serviceaccounts"))
    body = raycluster("probe")
    api.request("POST", "/apis/ray.io/v1/namespaces/default/rayclusters", body)
    pods = wait_for(
        "the operator's pods",
        lambda: (
            (p := api.items("/api/v1/namespaces/default/pods", labelSelector="ray.io/cluster=probe"))
            and len(p) == 3
            and p
        ),
    )
    head = next(p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "head")
    assert head["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
    command = head["spec"]["containers"][0]["args"][0]
    assert command.startswith("ulimit -n 65536; ray start --head") and "--dashboard-host=0.0.0.0" in command
    service = api.request("GET", "/api/v1/namespaces/default/services/probe-head-svc")
    assert service["spec"]["clusterIP"] == "None"  # KubeRay's head Service is headless
    assert api.request("GET", "/api/v1/namespaces/default/services/probe-headless")  # numOfHosts > 1
    # no nodes: the real scheduler leaves every pod Pending, and the real operator says so
    status = wait_for(
        "a status",
        lambda: (
            api.request("GET", "/apis/ray.io/v1/namespaces/default/rayclusters/probe")
            .get("status", {})
            .get("conditions")
        ),
    )
    conditions = {c["type"]: c for c in status}
    assert conditions["HeadPodReady"]["status"] == "False"
    assert conditions["RayClusterProvisioned"]["status"] == "False"
    pod = api.request("GET", f"/api/v1/namespaces/default/pods/{head['metadata']['name']}")
    wait_for(
        "the scheduler's verdict",
        lambda: any(
            c.get("reason") == "Unschedulable"
            for c in api.request("GET", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
            .get("status", {})
            .get("conditions")
            or []
        ),
    )
    api.request("DELETE", "/apis/ray.io/v1/namespaces/default/rayclusters/probe")
    wait_for(
        "garbage collection of the pods and services",
        lambda: (
            not api.items("/api/v1/namespaces/default/pods", labelSelector="ray.io/cluster=probe")
            and not [
                s
                for s in api.items("/api/v1/namespaces/default/services")
                if s["metadata"]["name"].startswith("probe-")
            ]
        ),
    )


def test_a_stopped_plane_leaves_no_process(plane: ControlPlane) -> None:
    """The module's plane, stopped by its last test (the fixture's stop after it finds nothing left to stop)."""
    pids = [c.pid for c in plane.components.values()]
    plane.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
