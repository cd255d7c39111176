"""The simulated KubeRay's authOptions: the token Secret, the auth variables on every Ray container, and the
token handed to the launched Ray processes (fake launcher: no Ray)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.polling import until

from tpuflow.kuberay.manifests import RayClusterTemplate, auth_secret_name, raycluster_manifest, rayservice_manifest
from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, KubeRayStandin, StaticNodePools
from tpuflow_rehearsal.standins.kuberay_controller.auth import SECRETS, check_name
from tpuflow_rehearsal.standins.kubernetes_api import PODS, RAYCLUSTERS, RAYSERVICES

V6E = TpuSlice.from_spec("v6e", "2x2")
NS = "default"
IMAGE = "rayproject/ray:2.60.0-py311"


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeRayStandin]:
    launcher = FakeRayLauncher()
    standin = KubeRayStandin(
        tmp_path, launcher=launcher, node_pools=StaticNodePools([(dict(V6E.node_selector), 2)]), interval=0.05
    )
    with standin:
        yield standin
    assert standin.controller.errors == []


def launched(kube: KubeRayStandin) -> list[Any]:
    launcher = kube.controller.launcher
    assert isinstance(launcher, FakeRayLauncher)
    return until(lambda: list(launcher.launched))


def test_token_mode_creates_the_secret_and_sets_the_variables_on_every_container(kube: KubeRayStandin) -> None:
    body = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE), name="rc-auth", namespace=NS)
    kube.store.create(RAYCLUSTERS, NS, body)
    secret = until(lambda: kube.store.find(SECRETS, NS, "rc-auth"))
    assert secret is not None and set(secret["data"]) == {"auth_token"}
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    assert len(token) >= 32
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
    assert auth_secret_name("rc-auth", body["spec"]) == "rc-auth"  # where the operators look for it

    # the head and the workers are made one by one: wait for all of them, not the first
    pods = until(lambda: kube.store.list(PODS, NS, "ray.io/cluster=rc-auth"), lambda p: len(p) == 1 + V6E.total_hosts)
    assert len(pods) == 1 + V6E.total_hosts
    for pod in pods:
        for container in pod["spec"]["containers"]:
            env = {e["name"]: e for e in container["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env["RAY_AUTH_TOKEN"] == {
                "name": "RAY_AUTH_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "rc-auth", "key": "auth_token"}},
            }
            assert token not in str(pod)  # pods reference the Secret, never hold the token

    [handle] = launched(kube)
    assert handle.spec.env["RAY_AUTH_MODE"] == "token" and handle.spec.env["RAY_AUTH_TOKEN"] == token


def test_a_rayservice_cluster_gets_its_own_secret(kube: KubeRayStandin) -> None:
    serve = {"applications": [{"name": "app", "import_path": "m:app"}]}
    kube.store.create(
        RAYSERVICES, NS, rayservice_manifest(RayClusterTemplate(V6E, image=IMAGE), serve, name="svc", namespace=NS)
    )
    [handle] = launched(kube)
    secret = kube.store.find(SECRETS, NS, handle.spec.name)
    assert secret is not None
    assert handle.spec.env["RAY_AUTH_TOKEN"] == base64.b64decode(secret["data"]["auth_token"]).decode()


def test_disabled_mode_creates_no_secret_and_sets_no_token(kube: KubeRayStandin) -> None:
    body = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE, auth_mode="disabled"), name="rc-open")
    kube.store.create(RAYCLUSTERS, NS, body)
    [handle] = launched(kube)
    assert "RAY_AUTH_TOKEN" not in handle.spec.env and "RAY_AUTH_MODE" not in handle.spec.env
    assert kube.store.find(SECRETS, NS, "rc-open") is None
    assert auth_secret_name("rc-open", body["spec"]) is None


def test_a_named_secret_is_used_as_given(kube: KubeRayStandin) -> None:
    kube.store.create(
        SECRETS,
        NS,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mine"}, "data": {"auth_token": "bXktdG9rZW4="}},
    )
    body = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE), name="rc-named", namespace=NS)
    body["spec"]["authOptions"]["secretName"] = "mine"
    kube.store.create(RAYCLUSTERS, NS, body)
    [handle] = launched(kube)
    assert handle.spec.env["RAY_AUTH_TOKEN"] == "my-token"
    assert kube.store.find(SECRETS, NS, "rc-named") is None
    assert auth_secret_name("rc-named", body["spec"]) == "mine"


def test_secret_names_follow_kuberay_check_name() -> None:
    long = "a" * 10 + "-" + "b" * 49
    spec = {"authOptions": {"mode": "token"}}
    assert check_name(long) == auth_secret_name(long, spec) == "r" + "b" * 49
    assert check_name("9lives") == auth_secret_name("9lives", spec) == "rlives"
