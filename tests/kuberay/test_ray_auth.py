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

from tpuflow.errors import UserInputError
from tpuflow.kuberay.addresses import cluster_payload, service_payload
from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest, rayservice_manifest
from tpuflow.kuberay.operators import KubeRayCreateClusterOperator
from tpuflow.kuberay.ray_auth import RAY_AUTH_VALUES
from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, KubeRayStandin, StaticNodePools
from tpuflow_rehearsal.standins.kubernetes_api import CORE_TYPES

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
    op = KubeRayCreateClusterOperator(task_id="c", tpu_slice=V6E, image=IMAGE, ray_auth="disabled")
    assert op.build_template().cluster_spec()["authOptions"] == {"mode": "disabled"}
    with pytest.raises(UserInputError, match="ray_auth"):
        KubeRayCreateClusterOperator(task_id="c2", tpu_slice=V6E, image=IMAGE, ray_auth="yes")


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
        task_id="ray_cluster", tpu_slice=V6E, image=IMAGE, kubernetes_conn_id="kube_standin", poll_interval=0.1
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


# --- every RayCluster / RayService the project applies carries token auth unless opted out by name ---
def _user_manifest(**spec: object) -> dict:
    manifest = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE), name="mine")
    del manifest["spec"]["authOptions"]
    manifest["spec"].update(spec)
    return manifest


def test_a_user_manifest_without_auth_is_completed_and_the_log_says_so(capfd: pytest.CaptureFixture[str]) -> None:
    op = KubeRayCreateClusterOperator(task_id="ray_cluster", manifest=_user_manifest())
    capfd.readouterr()
    body = op.build_body(task_context(task_id="ray_cluster"), "default")
    assert body["spec"]["authOptions"] == {"mode": "token"}
    assert schema_errors("rayclusters", body) == []
    out, err = capfd.readouterr()  # Airflow's task log goes to stdout
    assert "sets no spec.authOptions" in out + err and "mode=token" in out + err
    # a manifest's own token settings (its own Secret) are kept as written, and nothing is logged
    own = _user_manifest(authOptions={"mode": "token", "secretName": "team-token"})
    body = KubeRayCreateClusterOperator(task_id="own", manifest=own).build_body(task_context(task_id="own"), "default")
    assert body["spec"]["authOptions"] == {"mode": "token", "secretName": "team-token"}
    out, err = capfd.readouterr()
    assert "authOptions" not in out + err


def test_a_manifest_that_turns_auth_off_is_refused_in_one_line_unless_the_user_opts_out() -> None:
    opened = _user_manifest(authOptions={"mode": "disabled"})
    with pytest.raises(UserInputError, match=r"manifest\.spec\.authOptions\.mode") as err:
        KubeRayCreateClusterOperator(task_id="c", manifest=opened)
    assert "\n" not in str(err.value) and "ray_auth='disabled'" in str(err.value)
    op = KubeRayCreateClusterOperator(task_id="c", manifest=opened, ray_auth="disabled")
    assert op.build_body(task_context(task_id="c"), "default")["spec"]["authOptions"] == {"mode": "disabled"}
    with pytest.raises(UserInputError, match="2.52.0"):
        KubeRayCreateClusterOperator(task_id="old", manifest=_user_manifest(rayVersion="2.40.0"))


@pytest.mark.parametrize("opt_out", ["disabled", "none"])
def test_opting_out_by_name_reaches_manifests_templates_and_services(opt_out: str) -> None:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator

    manifest_op = KubeRayCreateClusterOperator(task_id="m", manifest=_user_manifest(), ray_auth=opt_out)
    assert manifest_op.build_body(task_context(task_id="m"), "default")["spec"]["authOptions"] == {"mode": "disabled"}
    template_op = KubeRayCreateClusterOperator(task_id="t", tpu_slice=V6E, image=IMAGE, ray_auth=opt_out)
    assert template_op.build_template().cluster_spec()["authOptions"] == {"mode": "disabled"}
    service = KubeRayDeployServiceOperator(
        task_id="s", tpu_slice=V6E, image=IMAGE, serve_config=SERVE, ray_auth=opt_out
    )
    body = service.build_body(task_context(task_id="s"), "default")
    assert body["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "disabled"}
    assert schema_errors("rayservices", body) == []


def test_the_rayservice_operator_applies_token_auth_by_default() -> None:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator

    service = KubeRayDeployServiceOperator(task_id="s", tpu_slice=V6E, image=IMAGE, serve_config=SERVE)
    assert service.build_body(task_context(task_id="s"), "default")["spec"]["rayClusterConfig"]["authOptions"] == {
        "mode": "token"
    }
    with pytest.raises(UserInputError, match="ray_auth"):
        KubeRayDeployServiceOperator(task_id="s2", tpu_slice=V6E, image=IMAGE, serve_config=SERVE, ray_auth="off")


@pytest.mark.parametrize(("ray_auth", "mode"), [(None, "token"), ("none", "disabled")])
def test_the_gke_pipelines_clusters_all_carry_the_dags_auth(ray_auth: str | None, mode: str) -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.gke import build_gke_pipeline_dag, prep_cluster_manifest

    assert prep_cluster_manifest(IMAGE)["spec"]["authOptions"] == {"mode": "token"}
    assert schema_errors("rayclusters", {**prep_cluster_manifest(IMAGE), "metadata": {"name": "p"}}) == []
    extra = {} if ray_auth is None else {"ray_auth": ray_auth}
    dag = build_gke_pipeline_dag(
        "auth_gke",
        workload=ADDITION,
        project_id="tpuflow-test",
        location="us-east5-b",
        cluster_name="ml",
        image=IMAGE,
        schedule=None,
        **extra,
    )
    prep = dag.get_task("create_prep_cluster")
    assert prep.manifest["spec"]["authOptions"] == {"mode": mode}
    body = prep.build_body(task_context(task_id="create_prep_cluster"), "default")
    assert body["spec"]["authOptions"] == {"mode": mode}
    for task_id in ("create_ray_cluster", "deploy"):
        assert RAY_AUTH_VALUES[dag.get_task(task_id).ray_auth] == mode, task_id
