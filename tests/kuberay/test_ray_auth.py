"""Ray token authentication on KubeRay: manifests turn it on (authOptions, CRD-valid), the cluster payload
carries a reference to the token Secret (never the token), and the Ray hooks read the token from that
Secret through the Kubernetes connection and send it as the bearer header (stand-in, fake launcher)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.airflow_context import task_context
from support.kuberay_crds import schema_errors
from tpuflow.dev.standins.kuberay_controller import FakeRayLauncher, KubeRayStandin, StaticNodePools
from tpuflow.dev.standins.kubernetes_api import CORE_TYPES
from tpuflow.errors import UserInputError
from tpuflow.kuberay.addresses import cluster_payload, service_payload
from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest, rayservice_manifest
from tpuflow.kuberay.operators import KubeRayCreateClusterOperator
from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.tpu import TpuSlice

V6E = TpuSlice.from_spec("v6e", "2x2")
IMAGE = "rayproject/ray:2.60.0-py311"
SERVE = {"applications": [{"name": "app", "import_path": "m:app"}]}
SECRETS = CORE_TYPES["secrets"]


def test_manifests_turn_token_auth_on_by_default_and_stay_crd_valid() -> None:
    cluster = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE), name="rc", namespace="ml")
    service = rayservice_manifest(RayClusterTemplate(V6E, image=IMAGE), SERVE, name="svc", namespace="ml")
    assert cluster["spec"]["authOptions"] == {"mode": "token"}
    assert service["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}
    assert schema_errors("rayclusters", cluster) == [] and schema_errors("rayservices", service) == []
    # ClusterIP stays the default: no serviceType, no ingress on the head.
    assert "serviceType" not in cluster["spec"]["headGroupSpec"] and "enableIngress" not in json.dumps(cluster)


def test_auth_can_be_turned_off_and_bad_values_name_the_argument() -> None:
    opened = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE, auth_mode="disabled"), name="rc")
    assert opened["spec"]["authOptions"] == {"mode": "disabled"}
    assert schema_errors("rayclusters", opened) == []
    with pytest.raises(UserInputError, match="ray_auth"):
        RayClusterTemplate(V6E, image=IMAGE, auth_mode="on").validated()
    with pytest.raises(UserInputError, match="2.52.0"):
        RayClusterTemplate(V6E, image="rayproject/ray:2.40.0", ray_version="2.40.0").validated()
    RayClusterTemplate(V6E, image="rayproject/ray:2.40.0", ray_version="2.40.0", auth_mode="disabled").validated()


def test_operator_argument_reaches_the_manifest() -> None:
    op = KubeRayCreateClusterOperator(task_id="c", tpu=V6E, image=IMAGE, ray_auth="disabled")
    assert op.build_template().cluster_spec()["authOptions"] == {"mode": "disabled"}
    with pytest.raises(UserInputError, match="ray_auth"):
        KubeRayCreateClusterOperator(task_id="c2", tpu=V6E, image=IMAGE, ray_auth="yes")


def _ready(manifest: dict) -> dict:
    manifest = json.loads(json.dumps(manifest))
    manifest["status"] = {"head": {"serviceIP": "10.0.0.7", "podName": "rc-head"}}
    return manifest


def test_payloads_reference_the_secret_never_a_token() -> None:
    target = {"kubernetes_conn_id": "kube", "cluster_url": None}
    cluster = _ready(raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE), name="rc", namespace="ml"))
    payload = cluster_payload(cluster, None, mode="head_service", in_cluster=False, target=target)
    assert payload["ray_auth"] == {"secret_name": "rc", "namespace": "ml", "key": "auth_token", "kube_target": target}
    service = {"metadata": {"name": "svc", "namespace": "ml"}, "status": {}}
    assert (
        service_payload(service, payload, None, mode="head_service", in_cluster=False)["ray_auth"]
        == payload["ray_auth"]
    )
    opened = _ready(raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE, auth_mode="disabled"), name="rc"))
    assert "ray_auth" not in cluster_payload(opened, None, mode="head_service", in_cluster=False, target=target)


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeRayStandin]:
    standin = KubeRayStandin(
        tmp_path, launcher=FakeRayLauncher(), node_pools=StaticNodePools([(dict(V6E.node_selector), 1)]), interval=0.05
    )
    with standin:
        for key, value in standin.connection_env("kube_standin").items():
            monkeypatch.setenv(key, value)
        yield standin


def test_hooks_read_the_token_from_the_secret_and_never_log_it(
    kube: KubeRayStandin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    op = KubeRayCreateClusterOperator(
        task_id="ray_cluster", tpu=V6E, image=IMAGE, kubernetes_conn_id="kube_standin", poll_interval=0.1
    )
    payload = op.execute(task_context(dag_id="auth", run_id="manual__auth", task_id="ray_cluster"))
    secret = kube.store.get(SECRETS, "default", payload["ray_auth"]["secret_name"])
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    assert token not in json.dumps(payload)
    assert payload["ray_auth"]["kube_target"]["kubernetes_conn_id"] == "kube_standin"

    hook = RayJobHook(cluster=payload)
    assert hook.headers() == {"Authorization": f"Bearer {token}"}
    assert asyncio.run(RayJobHook(cluster=payload).aheaders()) == {"Authorization": f"Bearer {token}"}
    assert token not in caplog.text and kube.api.token not in caplog.text

    # (deleting the real Secret races the simulated KubeRay, which recreates it as KubeRay would)
    gone = {**payload, "ray_auth": {**payload["ray_auth"], "secret_name": "no-such-secret"}}
    with pytest.raises(RuntimeError, match="is missing or empty"):
        RayJobHook(cluster=gone).headers()


def test_local_clusters_keep_their_token_file(tmp_path: Path) -> None:
    token_file = tmp_path / "auth_token"
    token_file.write_text("local-token\n")
    assert RayJobHook(cluster={"auth_token_path": str(token_file)}).headers() == {"Authorization": "Bearer local-token"}
    assert RayJobHook(cluster={"dashboard_url": "http://x"}).headers() == {}


def test_a_mangled_reference_is_one_line_naming_it() -> None:
    with pytest.raises(UserInputError, match="ray_auth"):
        RayJobHook(cluster={"ray_auth": {"secret_name": "rc"}}).headers()
