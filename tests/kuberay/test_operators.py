"""KubeRay operators against the Kubernetes stand-in, through the real kubernetes client and the
providers' hooks (connection from an AIRFLOW_CONN_* env var). The deferral path is exercised as the
triggerer would: the trigger is rebuilt from serialize() (plain JSON) and its event fed to execute_complete.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from support.airflow_context import FakeTaskInstance, task_context

from tpuflow.errors import UserInputError
from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest
from tpuflow.kuberay.operators import (
    KubeRayCreateClusterOperator,
    KubeRayDeleteClusterOperator,
    KubeRayDeleteServiceOperator,
    KubeRayDeployServiceOperator,
)
from tpuflow.kubernetes.ownership import resource_name
from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller import FakeServeBehaviour, KubeRayStandin, StaticNodePools
from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS, RAYSERVICES

CONN = "kube_standin"
V6E = TpuSlice.from_spec("v6e", "4x4")
IMAGE = "rayproject/ray:2.60.0-py311"
SERVE = {
    "applications": [
        {
            "name": "llm",
            "import_path": "workloads.serve:app",
            "route_prefix": "/",
            "args": V6E.serve_accelerator_config(),  # a multi-host model names its slice's topology
            "deployments": [{"name": "LLMServer"}],
        }
    ]
}


def ti_for(task_id: str, run_id: str = "manual__2026-11-29") -> FakeTaskInstance:
    return FakeTaskInstance(dag_id="tpu_llm_pipeline_gke", run_id=run_id, task_id=task_id)


@pytest.fixture
def kube(standin: KubeRayStandin, monkeypatch: pytest.MonkeyPatch) -> KubeRayStandin:
    for key, value in standin.connection_env(CONN).items():
        monkeypatch.setenv(key, value)
    return standin


def add_pool(kube: KubeRayStandin, tpu: TpuSlice = V6E) -> None:
    pools = kube.controller.node_pools
    assert isinstance(pools, StaticNodePools)
    pools.pools.append((dict(tpu.node_selector), tpu.total_hosts))


def run(op: Any, ti: FakeTaskInstance | None = None) -> Any:
    """execute(); on deferral run the trigger like the triggerer (from its serialized form), then resume."""
    context: Any = task_context(ti or ti_for(op.task_id))
    try:
        return op.execute(context)
    except TaskDeferred as deferred:
        classpath, kwargs = deferred.trigger.serialize()
        json.dumps(kwargs)  # trigger kwargs are plain JSON
        module, _, cls = classpath.rpartition(".")
        trigger = getattr(importlib.import_module(module), cls)(**kwargs)

        async def first_event() -> Any:
            async for event in trigger.run():
                return event.payload
            raise AssertionError("trigger ended without an event")

        payload = asyncio.run(first_event())
        json.dumps(payload)
        return getattr(op, deferred.method_name)(context, payload)


def _slice_op(cls: Any, task_id: str, kw: dict[str, Any]) -> Any:
    """An operator of `cls` on the stand-in's connection, the v6e 4x4 slice and test-sized waits."""
    defaults = {"tpu_slice": V6E, "image": IMAGE, "task_id": task_id, "wait_timeout": 10}
    return cls(kubernetes_conn_id=CONN, poll_interval=0.1, **{**defaults, **kw})


def create_op(**kw: Any) -> KubeRayCreateClusterOperator:
    return _slice_op(KubeRayCreateClusterOperator, "ray_cluster", kw)  # type: ignore[no-any-return]


def test_create_waits_deferrably_and_returns_the_addresses(kube: KubeRayStandin) -> None:
    add_pool(kube)
    ti = ti_for("ray_cluster")
    payload = run(create_op(deferrable=True), ti)
    name = resource_name(ti.dag_id, ti.run_id, "ray_cluster")
    status = kube.store.get(RAYCLUSTERS, "default", name)["status"]
    ports = status["endpoints"]
    assert payload["name"] == name and payload["namespace"] == "default"
    assert payload["dashboard_url"] == f"http://127.0.0.1:{ports['dashboard']}"
    assert payload["serve_url"] == f"http://127.0.0.1:{ports['serve']}"
    assert payload["gcs_address"] == f"127.0.0.1:{ports['gcs']}"
    assert payload["address_mode"] == "head_service"
    assert payload["in_cluster_dns"]["dashboard_url"] == (
        f"http://{name}-head-svc.default.svc.cluster.local:{ports['dashboard']}"
    )
    assert payload["slice"]["topology"] == "4x4" and payload["slice"]["num_hosts"] == 4
    assert ti.xcoms["ray_dashboard"] == payload["dashboard_url"]
    handle = kube.controller.handle_for("default", name)
    assert handle is not None and payload["dashboard_url"] == handle.dashboard_url

    # A retry of the same task instance adopts the ready cluster instead of creating a second one.
    posts = sum(1 for method, path, *_ in kube.api.requests if method == "POST")
    again = run(create_op(deferrable=True), ti_for("ray_cluster"))
    assert again["dashboard_url"] == payload["dashboard_url"]
    assert sum(1 for method, path, *_ in kube.api.requests if method == "POST") == posts
    assert len(kube.store.list(RAYCLUSTERS)) == 1

    with pytest.raises(AirflowFailException, match="different spec"):
        run(create_op(image="rayproject/ray:2.60.0-py312"), ti_for("ray_cluster"))

    assert run(create_op(address_mode="in_cluster_dns"), ti_for("ray_cluster"))["dashboard_url"].startswith(
        f"http://{name}-head-svc.default.svc.cluster.local:"
    )


def test_wrong_numofhosts_fails_before_anything_is_sent(kube: KubeRayStandin) -> None:
    manifest = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE), name="copied-sample")
    manifest["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 2
    with pytest.raises(UserInputError) as err:  # a static manifest is checked when the DAG file is parsed
        KubeRayCreateClusterOperator(task_id="ray_cluster", kubernetes_conn_id=CONN, manifest=manifest)
    assert err.value.field == "manifest.spec.workerGroupSpecs[0].numOfHosts"
    assert "needs numOfHosts=4" in str(err.value)
    assert not any(method == "POST" for method, *_ in kube.api.requests)


def test_wrong_numofhosts_rejected_by_the_tpu_webhook_ends_the_task_at_once(kube: KubeRayStandin) -> None:
    manifest = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE), name="copied-sample")
    manifest["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 2
    op = KubeRayCreateClusterOperator(
        task_id="ray_cluster",
        kubernetes_conn_id=CONN,
        manifest=manifest,
        tpu_preflight=False,
        wait_timeout=60,
        deferrable=True,
    )
    started = time.monotonic()
    with pytest.raises(AirflowFailException) as err:
        run(op)
    text = str(err.value)
    assert "Number of workers in worker group not equal to specified topology" in text
    assert "numOfHosts=2, but topology 4x4" in text and "workerGroupSpecs[0].numOfHosts=4" in text
    assert time.monotonic() - started < 5 and kube.store.list(RAYCLUSTERS) == []


@pytest.mark.parametrize("deferrable", [True, False])
def test_a_cluster_that_never_becomes_ready_fails_at_the_deadline_with_reasons(
    kube: KubeRayStandin, deferrable: bool
) -> None:
    # No node pool matches the TPU worker group: its pods stay Pending (FailedScheduling).
    op = create_op(deferrable=deferrable, wait_timeout=1.5, log_lines=5)
    started = time.monotonic()
    with pytest.raises(AirflowException) as err:
        run(op)
    elapsed = time.monotonic() - started
    text = str(err.value)
    assert 1.5 <= elapsed < 5, elapsed
    assert "not ready by the deadline" in text and "0/4 worker pods ready" in text
    assert "FailedScheduling" in text and "didn't match Pod's node affinity/selector" in text
    assert "is Pending (Unschedulable" in text
    assert "log lines of head pod" in text and "pod created by the simulated KubeRay operator" in text


def test_existing_object_of_another_owner_is_not_adopted(kube: KubeRayStandin) -> None:
    kube.store.create(RAYCLUSTERS, "default", raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE), name="shared"))
    with pytest.raises(AirflowFailException, match="belongs to something other than tpuflow"):
        run(create_op(name="shared"))


def deploy_op(**kw: Any) -> KubeRayDeployServiceOperator:
    return _slice_op(KubeRayDeployServiceOperator, "serve", {"serve_config": SERVE, **kw})  # type: ignore[no-any-return]


def test_deploy_service_then_update_in_place_then_delete(kube: KubeRayStandin) -> None:
    add_pool(kube)
    payload = run(deploy_op(name="llm-endpoint", deferrable=True))
    status = kube.store.get(RAYSERVICES, "default", "llm-endpoint")["status"]
    cluster = status["activeServiceStatus"]["rayClusterName"]
    handle = kube.controller.handle_for("default", cluster)
    assert handle is not None
    assert payload["applications"] == {"llm": "RUNNING"} and payload["ray_cluster_name"] == cluster
    assert payload["serve_url"] == f"http://127.0.0.1:{handle.serve_port}"
    assert payload["in_cluster_dns"]["serve_url"] == "http://llm-endpoint-serve-svc.default.svc.cluster.local:" + str(
        handle.serve_port
    )

    updated = {"applications": [{**SERVE["applications"][0], "route_prefix": "/v2"}]}
    again = run(deploy_op(name="llm-endpoint", serve_config=updated, deferrable=False), ti_for("serve", run_id="r2"))
    assert again["ray_cluster_name"] == cluster  # same cluster: no second slice
    assert handle.deployed[-1]["applications"][0]["route_prefix"] == "/v2"  # type: ignore[attr-defined]

    with pytest.raises(AirflowFailException, match="second\\s+TPU slice"):
        run(deploy_op(name="llm-endpoint", image="rayproject/ray:2.60.0-py312"), ti_for("serve", run_id="r3"))

    deleted = run(
        KubeRayDeleteServiceOperator(
            task_id="delete_serve", name="llm-endpoint", kubernetes_conn_id=CONN, poll_interval=0.1, deferrable=True
        )
    )
    assert deleted == {
        "kind": "RayService",
        "name": "llm-endpoint",
        "namespace": "default",
        "existed": True,
        "deleted": True,
    }
    assert kube.store.list(RAYSERVICES) == []


def test_service_stuck_deploying_fails_at_the_deadline_naming_the_deployment(kube: KubeRayStandin) -> None:
    add_pool(kube)
    kube.launcher.serve["llm"] = FakeServeBehaviour(  # type: ignore[attr-defined]
        app_status="DEPLOYING",
        deployment_message="Deployment 'LLMServer' in application 'llm' has 1 replicas that "
        "have taken more than 30s to be scheduled. Resources required for each replica: {'TPU': 4.0, 'CPU': 1.0}",
    )
    started = time.monotonic()
    with pytest.raises(AirflowException) as err:
        run(deploy_op(deferrable=True, wait_timeout=1.5))
    text = str(err.value)
    assert 1.5 <= time.monotonic() - started < 5
    assert "deployment 'LLMServer' of application 'llm' is UPDATING" in text
    assert "accelerator_config" in text and "topology" in text


def test_service_deploy_failed_fails_fast(kube: KubeRayStandin) -> None:
    add_pool(kube)
    kube.launcher.serve["*"] = FakeServeBehaviour(  # type: ignore[attr-defined]
        app_status="DEPLOY_FAILED", message="ModuleNotFoundError: No module named 'workloads.serve'"
    )
    started = time.monotonic()
    with pytest.raises(AirflowException) as err:
        run(deploy_op(deferrable=True, wait_timeout=30))
    assert time.monotonic() - started < 5
    assert "application 'llm' is DEPLOY_FAILED" in str(err.value) and "ModuleNotFoundError" in str(err.value)


def delete_cluster_op() -> KubeRayDeleteClusterOperator:
    """A deferrable teardown of the RayCluster the task "ray_cluster" created."""
    return KubeRayDeleteClusterOperator(
        task_id="delete_ray_cluster",
        cluster_task_id="ray_cluster",
        kubernetes_conn_id=CONN,
        poll_interval=0.1,
        deferrable=True,
    )


def test_delete_cluster_by_task_id_waits_until_gone(kube: KubeRayStandin) -> None:
    add_pool(kube)
    created = run(create_op())
    op = delete_cluster_op()
    result = run(op, ti_for("delete_ray_cluster"))
    assert result["name"] == created["name"] and result["deleted"] and result["existed"]
    assert kube.store.list(RAYCLUSTERS) == []
    assert run(op, ti_for("delete_ray_cluster"))["existed"] is False  # a second teardown is a no-op


class _Deferred(Exception):
    """What the spied execute_async raises in place of TaskDeferred."""


@pytest.mark.parametrize(
    "cls",
    [
        KubeRayCreateClusterOperator,
        KubeRayDeployServiceOperator,
        KubeRayDeleteClusterOperator,
        KubeRayDeleteServiceOperator,
    ],
)
def test_every_waiting_operator_has_the_one_skeleton(cls: Any) -> None:
    own = {name for klass in cls.__mro__ if klass.__module__.startswith("tpuflow.") for name in vars(klass)}
    assert {"execute", "execute_async", "execute_sync", "execute_complete", "kuberay_kind"} <= own


def test_execute_hands_the_same_wait_to_execute_sync_or_execute_async(
    kube: KubeRayStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No node pool: the RayCluster stays unready, so execute reaches its wait and hands it on."""
    seen: list[tuple[str, dict[str, Any], Any]] = []

    def spy(path: str) -> Any:
        def step(self: Any, context: Any, wait: dict[str, Any], owned: Any) -> str:
            seen.append((path, wait, owned))
            if path == "async":
                raise _Deferred
            return "waited"

        return step

    monkeypatch.setattr(KubeRayCreateClusterOperator, "execute_sync", spy("sync"))
    monkeypatch.setattr(KubeRayCreateClusterOperator, "execute_async", spy("async"))
    assert create_op(deferrable=False).execute(task_context(ti_for("ray_cluster"))) == "waited"
    with pytest.raises(_Deferred):
        create_op(deferrable=True).execute(task_context(ti_for("ray_cluster")))

    assert [path for path, _, _ in seen] == ["sync", "async"]
    for _, wait, owned in seen:
        assert set(wait) == {"kind", "name", "namespace", "deadline", "poll_interval", "log_lines"}
        assert wait["kind"] == "RayCluster" and (owned.kind, owned.name) == ("RayCluster", wait["name"])
        assert owned.run_key


def test_bad_static_arguments_fail_at_parse_time() -> None:
    with pytest.raises(UserInputError) as err:
        KubeRayCreateClusterOperator(task_id="t", tpu_slice={"accelerator": "v6e", "topology": "16"}, image=IMAGE)
    assert err.value.field == "tpu_slice.topology"
    with pytest.raises(UserInputError) as err:
        KubeRayDeployServiceOperator(task_id="t", tpu_slice=V6E, image=IMAGE, serve_config={"applications": []})
    assert err.value.field == "serve_config.applications"
    with pytest.raises(UserInputError) as err:
        KubeRayCreateClusterOperator(task_id="t", tpu_slice=V6E, image=IMAGE, address_mode="nodeport")
    assert err.value.field == "address_mode"
    KubeRayCreateClusterOperator(
        task_id="t", tpu_slice={"accelerator": "{{ params.acc }}", "topology": "{{ params.topo }}"}, image=IMAGE
    )  # templated: checked at run time


def test_operator_module_is_cheap_to_import() -> None:
    code = (
        "import sys; from airflow.sdk import BaseOperator; before = set(sys.modules); "
        "import tpuflow.kuberay.operators; new = set(sys.modules) - before; "
        "print(sorted(m for m in new if m.split('.')[0] in ('kubernetes', 'kubernetes_asyncio', 'ray', 'google') "
        "or m.startswith(('airflow.providers', 'airflow.triggers'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_gke_cluster_with_a_kubernetes_connection_only_feeds_the_console_links(kube: KubeRayStandin) -> None:
    add_pool(kube)
    ti = ti_for("ray_cluster")
    gke = {"project_id": "tpuflow-test", "location": "us-east5", "cluster_name": "ml"}
    payload = run(create_op(gke_cluster=gke), ti)
    assert ti.xcoms["gke_ray_workloads"].startswith(
        "https://console.cloud.google.com/kubernetes/workload/overview?project=tpuflow-test"
    )
    assert ti.xcoms["gke_ray_head_pod"] == (
        "https://console.cloud.google.com/kubernetes/pod/us-east5/ml/default/"
        f"{payload['head_pod']}/details?project=tpuflow-test"
    )


def test_gke_cluster_alone_resolves_endpoint_and_ca_like_the_google_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

    from tpuflow.kubernetes.hooks import KubeTarget

    cluster = SimpleNamespace(
        endpoint="34.1.1.1",
        master_auth=SimpleNamespace(cluster_ca_certificate="Q0E="),
        private_cluster_config=SimpleNamespace(private_endpoint="10.0.0.2"),
    )
    seen: dict[str, Any] = {}

    def get_cluster(self: Any, name: str, project_id: str, **kw: Any) -> Any:
        seen.update(name=name, project_id=project_id)
        return cluster

    monkeypatch.setattr(GKEHook, "get_cluster", get_cluster)
    monkeypatch.setenv(
        "AIRFLOW_CONN_GCP", json.dumps({"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True}})
    )
    op = KubeRayCreateClusterOperator(
        task_id="rc",
        tpu_slice=V6E,
        image=IMAGE,
        gcp_conn_id="gcp",
        gke_cluster={
            "project_id": "tpuflow-test",
            "location": "us-east5",
            "cluster_name": "ml",
            "use_internal_ip": True,
        },
    )
    target = op.kube_target()
    assert seen == {"name": "ml", "project_id": "tpuflow-test"}
    assert (target.cluster_url, target.ssl_ca_cert, target.gcp_conn_id, target.kubernetes_conn_id) == (
        "https://10.0.0.2",
        "Q0E=",
        "gcp",
        None,
    )
    assert KubeTarget.from_dict(json.loads(json.dumps(target.to_dict()))) == target
    with pytest.raises(UserInputError, match="cluster_name"):
        KubeRayCreateClusterOperator(task_id="rc", tpu_slice=V6E, image=IMAGE, gke_cluster={"project_id": "p"})


# --- kill semantics: marking the task failed/success or clearing it deletes what it created -------------
def deferred_trigger(op: Any, ti: FakeTaskInstance | None = None) -> Any:
    """execute() until it defers; the trigger rebuilt from its serialized (JSON) form, as the triggerer does."""
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context(ti or ti_for(op.task_id)))
    classpath, kwargs = deferred.value.trigger.serialize()
    module, _, cls = classpath.rpartition(".")
    return getattr(importlib.import_module(module), cls)(**json.loads(json.dumps(kwargs)))


def deleting(kube: KubeRayStandin, rtype: Any, name: str) -> bool:
    obj = kube.store.find(rtype, "default", name)
    return obj is None or bool(obj["metadata"].get("deletionTimestamp"))


def test_killing_a_deferred_cluster_create_deletes_the_raycluster_but_a_triggerer_restart_does_not(
    kube: KubeRayStandin,
) -> None:
    # No node pool matches the TPU workers: the cluster stays unready and the task stays deferred.
    trigger = deferred_trigger(create_op(deferrable=True))
    assert trigger.owner_run_key

    async def scenario() -> tuple[bool, bool]:
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.3)
        waiting.cancel()  # a triggerer restart: the wait is cancelled and cleaned up, never killed
        await asyncio.gather(waiting, return_exceptions=True)
        await trigger.cleanup()
        after_restart = deleting(kube, RAYCLUSTERS, trigger.name)
        await trigger.on_kill()  # the user marks the task failed (or success, or clears it)
        return after_restart, deleting(kube, RAYCLUSTERS, trigger.name)

    assert asyncio.run(scenario()) == (False, True)


def test_killing_a_deferred_deploy_deletes_the_rayservice_it_created_not_one_it_only_updated(
    kube: KubeRayStandin,
) -> None:
    add_pool(kube)
    kube.launcher.serve["llm"] = FakeServeBehaviour(app_status="DEPLOYING")  # type: ignore[attr-defined]
    created = deferred_trigger(deploy_op(deferrable=True))
    asyncio.run(created.on_kill())
    assert deleting(kube, RAYSERVICES, created.name)

    first = deferred_trigger(deploy_op(name="llm-endpoint", deferrable=True), ti_for("serve", run_id="r1"))
    updated = {"applications": [{**SERVE["applications"][0], "route_prefix": "/v2"}]}
    update = deferred_trigger(
        deploy_op(name="llm-endpoint", serve_config=updated, deferrable=True), ti_for("serve", run_id="r2")
    )
    asyncio.run(update.on_kill())  # run r2's task is killed: the endpoint run r1 created keeps serving
    assert not deleting(kube, RAYSERVICES, "llm-endpoint")
    asyncio.run(first.on_kill())
    assert deleting(kube, RAYSERVICES, "llm-endpoint")


def test_killing_a_cluster_create_waiting_in_the_worker_deletes_the_raycluster(kube: KubeRayStandin) -> None:
    import threading

    op = create_op(deferrable=False, wait_timeout=20)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            run(op)
        except BaseException as err:  # the wait sees its object deleted and fails
            failure.append(err)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while op._owned is None:
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.02)
    name = op._owned.name
    assert not deleting(kube, RAYCLUSTERS, name)

    op.on_kill()  # what the task runner's SIGTERM handler calls

    assert deleting(kube, RAYCLUSTERS, name)
    worker.join(timeout=15)
    assert failure and isinstance(failure[0], AirflowException)


# --- hooks: the providers' hooks, with their GKE variants -------------------------------------------------
def test_the_hooks_are_the_providers_kubernetes_hooks_and_their_gke_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook, KubernetesHook
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook, GKEKubernetesHook

    from tpuflow.kuberay.hooks import AsyncKubeRayHook, KubeRayHook
    from tpuflow.kubernetes.hooks import KubeTarget

    monkeypatch.setenv(
        "AIRFLOW_CONN_GCP", json.dumps({"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True}})
    )
    conn = KubeTarget(kubernetes_conn_id=CONN)
    assert type(KubeRayHook.for_target(conn)) is KubeRayHook and isinstance(
        KubeRayHook.for_target(conn), KubernetesHook
    )
    assert type(AsyncKubeRayHook.for_target(conn)) is AsyncKubeRayHook
    assert isinstance(AsyncKubeRayHook.for_target(conn), AsyncKubernetesHook)
    gke = KubeTarget(kubernetes_conn_id=None, cluster_url="https://10.0.0.2", ssl_ca_cert="Q0E=", gcp_conn_id="gcp")
    sync_hook, async_hook = KubeRayHook.for_target(gke), AsyncKubeRayHook.for_target(gke)
    assert isinstance(sync_hook, KubeRayHook) and isinstance(sync_hook, GKEKubernetesHook)
    assert isinstance(async_hook, AsyncKubeRayHook) and isinstance(async_hook, GKEKubernetesAsyncHook)
    assert sync_hook.default_namespace() == "default" and sync_hook.is_in_cluster is False
    assert sync_hook._cluster_url == "https://10.0.0.2" and async_hook._hook_kwargs["gcp_conn_id"] == "gcp"


def test_the_hooks_return_plain_json_and_raise_the_clients_errors(kube: KubeRayStandin) -> None:
    from kubernetes.client import ApiException

    from tpuflow.kuberay import RAYCLUSTERS as PLURAL
    from tpuflow.kuberay.hooks import AsyncKubeRayHook, KubeRayHook
    from tpuflow.kubernetes.hooks import KubeTarget

    add_pool(kube)
    run(create_op())
    target = KubeTarget(kubernetes_conn_id=CONN)
    hook = KubeRayHook.for_target(target)
    name = kube.store.list(RAYCLUSTERS)[0]["metadata"]["name"]
    pods = hook.pods("default", f"ray.io/cluster={name}")
    assert len(pods) == 5 and pods[0]["metadata"]["labels"]["ray.io/cluster"] == name  # camelCase JSON
    assert hook.get_service(f"{name}-head-svc", "default")["spec"]["clusterIP"] == "127.0.0.1"
    assert hook.get_service("nope", "default") is None and hook.get(PLURAL, "nope", "default") is None
    with pytest.raises(ApiException) as err:
        hook.create(PLURAL, {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name}}, "default")
    assert err.value.status == 409

    async def read() -> tuple[Any, Any, Any]:
        reader = AsyncKubeRayHook.for_target(target)
        return (
            await reader.get(PLURAL, name, "default"),
            await reader.pods("default", f"ray.io/cluster={name}"),
            await reader.delete(PLURAL, "nope", "default"),
        )

    obj, async_pods, deleted = asyncio.run(read())
    assert obj["metadata"]["name"] == name and deleted is False
    assert sorted(p["metadata"]["name"] for p in async_pods) == sorted(p["metadata"]["name"] for p in pods)


# --- template fields, parse-time and run-time checks ---------------------------------------------------------
def test_template_fields_keep_exactly_what_was_passed_and_are_checked_once_rendered(kube: KubeRayStandin) -> None:
    env, labels = {"A": "1"}, {"team": "ml"}
    templated = {"accelerator": "{{ params.acc }}", "topology": "4x4"}
    op = create_op(tpu_slice=templated, env=env, labels=labels)
    for field in op.template_fields:
        assert hasattr(op, field)
    assert op.env is env and op.labels is labels and op.tpu_slice is templated
    op.render_template_fields({"params": {"acc": "v6e-typo"}})  # a bad rendered value: checked before anything is sent
    assert op.tpu_slice == {"accelerator": "v6e-typo", "topology": "4x4"}
    with pytest.raises(UserInputError) as err:
        run(op)
    assert err.value.field == "tpu_slice.accelerator"
    assert not any(method == "POST" for method, *_ in kube.api.requests)
    with pytest.raises(UserInputError, match="poll_interval"):
        KubeRayCreateClusterOperator(task_id="t", tpu_slice=V6E, image=IMAGE, poll_interval=0)


def test_a_templated_tpu_slice_is_rendered_and_resolved_when_the_task_runs(kube: KubeRayStandin) -> None:
    add_pool(kube, TpuSlice.from_spec("v6e", "2x4", num_slices=2))
    op = create_op(
        tpu_slice={"accelerator": "{{ params.acc }}", "topology": "{{ params.topo }}", "num_slices": "{{ params.n }}"}
    )
    op.render_template_fields({"params": {"acc": "TPU-V6E", "topo": "2x4", "n": "2"}})
    assert op.resolved_slice() == TpuSlice.from_spec("v6e", "2x4", num_slices=2)
    payload = run(op)
    assert (payload["slice"]["topology"], payload["slice"]["num_slices"]) == ("2x4", 2)
    # A TpuSlice is static: checked at parse time, and rendering leaves the very object in place.
    op = create_op(tpu_slice=V6E)
    op.render_template_fields({"params": {}})
    assert op.tpu_slice is V6E


@pytest.mark.parametrize("cls", [KubeRayCreateClusterOperator, KubeRayDeployServiceOperator])
@pytest.mark.parametrize("old", [{"tpu": V6E}, {"accelerator": "v6e", "topology": "4x4"}])
def test_the_old_slice_kwargs_are_refused(cls: Any, old: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=f"(?s)Invalid arguments.*'{next(iter(old))}'"):
        cls(task_id="t", image=IMAGE, **old)


def test_on_kill_action_keep_leaves_the_rayservice(kube: KubeRayStandin) -> None:
    add_pool(kube)
    kube.launcher.serve["llm"] = FakeServeBehaviour(app_status="DEPLOYING")  # type: ignore[attr-defined]
    kept = deferred_trigger(deploy_op(deferrable=True, on_kill_action="keep"))
    assert kept.owner_run_key is None
    asyncio.run(kept.on_kill())
    assert not deleting(kube, RAYSERVICES, kept.name)
    with pytest.raises(UserInputError) as err:
        deploy_op(on_kill_action="drop")
    assert err.value.field == "on_kill_action"


def test_public_operators_document_every_argument() -> None:
    import inspect

    for cls in (
        KubeRayCreateClusterOperator,
        KubeRayDeployServiceOperator,
        KubeRayDeleteClusterOperator,
        KubeRayDeleteServiceOperator,
    ):
        doc = cls.__doc__ or ""
        names = {
            p
            for klass in cls.__mro__
            if "__init__" in vars(klass) and klass.__module__.startswith("tpuflow")
            for p in inspect.signature(klass.__init__).parameters
            if p not in ("self", "kwargs", "owner_task_id")
        }
        missing = sorted(n for n in names if f":param {n}:" not in doc)
        assert missing == [], f"{cls.__name__} does not document {missing}"


def test_a_natively_rendered_manifest_keeps_the_strings_kubernetes_requires(kube: KubeRayStandin) -> None:
    """A DAG with render_template_as_native_obj turns a manifest's "2" into 2; the body sent keeps
    rayStartParams and env values as strings (the CRD and the pod API reject numbers there)."""
    manifest = raycluster_manifest(RayClusterTemplate(V6E, image=IMAGE, env={"RAY_FLAG": "1"}), name="native")
    manifest["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 2
    manifest["spec"]["headGroupSpec"]["rayStartParams"]["block"] = True
    for group in [manifest["spec"]["headGroupSpec"], *manifest["spec"]["workerGroupSpecs"]]:
        for env in group["template"]["spec"]["containers"][0]["env"]:
            if env["name"] == "RAY_FLAG":
                env["value"] = 1
    op = KubeRayCreateClusterOperator(task_id="ray_cluster", kubernetes_conn_id=CONN, manifest=manifest)
    spec = op.build_body(task_context(task_id="ray_cluster"), "default")["spec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "2"
    assert spec["headGroupSpec"]["rayStartParams"]["block"] == "true"
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        flags = [e["value"] for e in group["template"]["spec"]["containers"][0]["env"] if e["name"] == "RAY_FLAG"]
        assert flags == ["1"]
    bad = dict(manifest, spec={**manifest["spec"], "headGroupSpec": {**manifest["spec"]["headGroupSpec"]}})
    bad["spec"]["headGroupSpec"]["rayStartParams"] = {"num-cpus": {"nested": 1}}
    with pytest.raises(UserInputError, match="headGroupSpec.rayStartParams.num-cpus"):
        KubeRayCreateClusterOperator(task_id="ray_cluster", kubernetes_conn_id=CONN, manifest=bad)


def test_an_empty_namespace_means_the_connections_and_a_bad_one_is_refused_at_parse_time() -> None:
    """The GKE DAG renders an unset tpuflow_kuberay_namespace Variable as "": the connection's namespace."""
    from tpuflow.errors import UserInputError

    v6e_2x2 = {"accelerator": "v6e", "topology": "2x2"}
    KubeRayCreateClusterOperator(task_id="t", tpu_slice=v6e_2x2, image=IMAGE, namespace="")
    with pytest.raises(UserInputError, match="namespace='Bad_NS'"):
        KubeRayCreateClusterOperator(task_id="t", tpu_slice=v6e_2x2, image=IMAGE, namespace="Bad_NS")


@pytest.mark.parametrize("factory", [create_op, deploy_op])
def test_the_object_carries_its_tpuflow_expires_label(factory: Any) -> None:
    """expires_after (default 24 hours, as for node pools) from the task's start is the object's tpuflow-expires
    label, which the orphan reaper reads; None: no label."""
    from datetime import timedelta

    def labels(**kw: Any) -> dict[str, str]:
        op = factory(**kw)
        return op.build_body(task_context(task_id=op.task_id), "default")["metadata"]["labels"]  # type: ignore[no-any-return]

    before = time.time()
    default = int(labels()["tpuflow-expires"])
    assert before + 24 * 3600 - 1 <= default <= time.time() + 24 * 3600
    assert abs(int(labels(expires_after=timedelta(minutes=90))["tpuflow-expires"]) - (time.time() + 5400)) <= 2
    assert abs(int(labels(expires_after=600)["tpuflow-expires"]) - (time.time() + 600)) <= 2
    assert "tpuflow-expires" not in labels(expires_after=None)
    assert labels(expires_after=None)["app.kubernetes.io/managed-by"] == "tpuflow"


def test_a_deferred_delete_ends_its_task_in_the_triggerer_once_the_object_is_gone(kube: KubeRayStandin) -> None:
    from support.triggerer import first_event, rebuilt

    from tpuflow.triggers import TaskEndedEvent

    add_pool(kube)
    created = run(create_op())
    op = delete_cluster_op()
    context: Any = task_context(ti_for("delete_ray_cluster"))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    event, stored = first_event(rebuilt(deferred.value))
    assert isinstance(event, TaskEndedEvent) and kube.store.list(RAYCLUSTERS) == []
    assert stored["return_value"] == op.execute_complete(context, event.payload)
    assert stored["return_value"]["name"] == created["name"] and stored["return_value"]["deleted"]
