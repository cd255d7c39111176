"""Where the Kubernetes API is (KubeTarget, serialisable for triggers) and which hook reaches it:
``for_target`` gives a hook family's GKE variant for a GKE endpoint, carrying the endpoint, CA and Google
Cloud identity, and the family's own hook on the kubernetes connection otherwise. Building a hook makes no
network call (every socket connect fails here)."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook, KubernetesHook
from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook, GKEKubernetesHook

from tpuflow.capacity.hooks import AsyncCapacityHook, CapacityHook, GKEAsyncCapacityHook, GKECapacityHook
from tpuflow.kuberay.hooks import AsyncKubeRayHook, GKEAsyncKubeRayHook, GKEKubeRayHook, KubeRayHook
from tpuflow.kubernetes.hooks import (
    AsyncKubeObjectsHook,
    GKEAsyncKubeObjectsHook,
    GKEKubeObjectsHook,
    KubeObjectsHook,
    KubeTarget,
)

GKE = KubeTarget(
    kubernetes_conn_id=None,
    cluster_url="https://10.0.0.2",
    ssl_ca_cert="Q0E=",
    gcp_conn_id="gcp_test",
    impersonation_chain=("a@p.iam.gserviceaccount.com", "b@p.iam.gserviceaccount.com"),
    use_dns_endpoint=True,
)
CONN = KubeTarget(kubernetes_conn_id="kube_test")

SYNC = [
    (KubeObjectsHook, GKEKubeObjectsHook),
    (KubeRayHook, GKEKubeRayHook),
    (CapacityHook, GKECapacityHook),
]
ASYNC = [
    (AsyncKubeObjectsHook, GKEAsyncKubeObjectsHook),
    (AsyncKubeRayHook, GKEAsyncKubeRayHook),
    (AsyncCapacityHook, GKEAsyncCapacityHook),
]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Google Cloud connection the GKE hooks read when built (anonymous), and no network at all."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_GCP_TEST", json.dumps({"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True}})
    )

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"network call while building a hook: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("target", [GKE, CONN, KubeTarget(), KubeTarget(impersonation_chain="one@p.iam")])
def test_kube_target_round_trips_through_json(target: KubeTarget) -> None:
    data = json.loads(json.dumps(target.to_dict()))  # what a trigger's serialize() hands the triggerer
    assert KubeTarget.from_dict(data) == target


def test_kube_target_is_gke_when_it_has_an_endpoint() -> None:
    assert GKE.gke and not CONN.gke and not KubeTarget().gke
    assert KubeTarget().kubernetes_conn_id == "kubernetes_default"
    assert GKE.gke_hook_kwargs() == {
        "cluster_url": "https://10.0.0.2",
        "ssl_ca_cert": "Q0E=",
        "gcp_conn_id": "gcp_test",
        "impersonation_chain": ("a@p.iam.gserviceaccount.com", "b@p.iam.gserviceaccount.com"),
        "use_dns_endpoint": True,
    }


@pytest.mark.parametrize(("hook", "gke_variant"), SYNC + ASYNC)
def test_for_target_on_a_connection_is_the_familys_own_hook(hook: type[Any], gke_variant: type[Any]) -> None:
    built = hook.for_target(CONN)
    assert type(built) is hook and built.conn_id == "kube_test"
    assert not isinstance(built, (GKEKubernetesHook, GKEKubernetesAsyncHook))


@pytest.mark.parametrize(("hook", "gke_variant"), SYNC)
def test_for_target_on_gke_is_the_familys_gke_variant(hook: type[Any], gke_variant: type[Any]) -> None:
    built = hook.for_target(GKE)
    assert type(built) is gke_variant and isinstance(built, hook) and isinstance(built, GKEKubernetesHook)
    assert (built.group, built.version) == (hook.group, hook.version)  # the family's API group survives
    assert (built._cluster_url, built._ssl_ca_cert) == ("https://10.0.0.2", "Q0E=")
    assert built.gcp_conn_id == "gcp_test" and built.impersonation_chain == GKE.impersonation_chain
    assert built.use_dns_endpoint is True
    assert built.default_namespace() == "default" and built.is_in_cluster is False


@pytest.mark.parametrize(("hook", "gke_variant"), ASYNC)
def test_for_target_on_gke_is_the_familys_async_gke_variant(hook: type[Any], gke_variant: type[Any]) -> None:
    built = hook.for_target(GKE)
    assert type(built) is gke_variant and isinstance(built, hook) and isinstance(built, GKEKubernetesAsyncHook)
    assert isinstance(built, AsyncKubernetesHook) and not isinstance(built, GKEKubernetesHook)
    assert (built.group, built.version) == (hook.group, hook.version)
    assert (built._cluster_url, built._ssl_ca_cert, built.use_dns_endpoint) == ("https://10.0.0.2", "Q0E=", True)
    # the sync GKE hook the async one builds on demand gets the same identity
    assert built._hook_kwargs["gcp_conn_id"] == "gcp_test"
    assert built._hook_kwargs["impersonation_chain"] == GKE.impersonation_chain


def test_every_family_names_its_own_gke_variant() -> None:
    """A family without one would inherit its parent's variant and lose its API group on GKE."""
    for hook, gke_variant in SYNC + ASYNC:
        assert hook.gke_variant is gke_variant, hook
    assert issubclass(GKEKubeObjectsHook, KubernetesHook)
