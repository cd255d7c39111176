"""The simulated KubeRay operator and GKE TPU webhook behind the Kubernetes stand-in (no Ray: fake launcher)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from support.polling import until

from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest, rayservice_manifest
from tpuflow.kuberay.status import Verdict, raycluster_verdict, rayservice_verdict
from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller import (
    FakeRayLauncher,
    FakeServeBehaviour,
    KubeRayStandin,
    StaticNodePools,
)
from tpuflow_rehearsal.standins.kubernetes_api import EVENTS, PODS, RAYCLUSTERS, RAYSERVICES, SERVICES

V6E = TpuSlice.from_spec("v6e", "4x4")
NS = "default"
SERVE = {"applications": [{"name": "llm", "import_path": "m:app", "deployments": [{"name": "LLMServer"}]}]}


@pytest.fixture
def kube(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[KubeRayStandin]:
    launcher = getattr(request, "param", None) or FakeRayLauncher()
    standin = KubeRayStandin(tmp_path, launcher=launcher, node_pools=StaticNodePools(), interval=0.05)
    standin.controller.serve_poll_interval = 0.05
    with standin:
        yield standin
    assert standin.controller.errors == [], "the simulated KubeRay operator raised while reconciling"


def api_client(kube: KubeRayStandin) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kube.kubeconfig_path))


def add_pool(kube: KubeRayStandin, tpu: TpuSlice, nodes: int | None = None) -> None:
    pools = kube.controller.node_pools
    assert isinstance(pools, StaticNodePools)
    pools.pools.append((dict(tpu.node_selector), nodes if nodes is not None else tpu.total_hosts))


def cluster_verdict(kube: KubeRayStandin, name: str) -> Verdict:
    return raycluster_verdict(kube.store.find(RAYCLUSTERS, NS, name))


def manifest(name: str, tpu: TpuSlice = V6E) -> dict[str, Any]:
    return raycluster_manifest(RayClusterTemplate(tpu, image="img"), name=name)


def test_tpu_webhook_rejects_a_wrong_numofhosts_through_the_client(kube: KubeRayStandin) -> None:
    body = manifest("bad")
    body["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 2
    co = client.CustomObjectsApi(api_client(kube))
    with pytest.raises(client.ApiException) as denied:
        co.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", body)
    status = json.loads(denied.value.body)
    assert denied.value.status == 400
    assert status["message"].endswith(
        "denied the request: Number of workers in worker group not equal to specified topology"
    )
    assert kube.store.find(RAYCLUSTERS, NS, "bad") is None
    co.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", manifest("good"))
    for _ in range(20):  # the controller writes the object too (finalizer, status): retry on a stale version
        ok = co.get_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", "good")
        ok["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 8
        with pytest.raises(client.ApiException) as update:
            co.replace_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", "good", ok)
        if update.value.status != 409:
            break
    assert update.value.status == 400  # the webhook also guards updates


def test_cluster_waits_for_a_matching_node_pool_then_becomes_ready(kube: KubeRayStandin) -> None:
    kube.store.create(RAYCLUSTERS, NS, manifest("rc"))
    verdict = until(lambda: cluster_verdict(kube, "rc"), lambda v: "HeadPodReady=True" in v.reason)
    assert verdict.state == "waiting" and "0/4 worker pods ready" in verdict.reason
    workers = kube.store.list(PODS, NS, "ray.io/cluster=rc,ray.io/node-type=worker")
    assert len(workers) == 4 and {p["status"]["phase"] for p in workers} == {"Pending"}
    assert workers[0]["spec"]["nodeSelector"] == V6E.node_selector
    events = until(lambda: kube.store.list(EVENTS, NS, field_selector="reason=FailedScheduling"), bool)
    assert "didn't match Pod's node affinity/selector" in events[0]["message"]
    assert "cloud.google.com/gke-tpu-topology=4x4" in events[0]["message"]

    add_pool(kube, V6E)
    assert until(lambda: cluster_verdict(kube, "rc"), lambda v: v.ready).ready
    rc = kube.store.get(RAYCLUSTERS, NS, "rc")
    status = rc["status"]
    assert (status["desiredWorkerReplicas"], status["readyWorkerReplicas"], status["state"]) == (4, 4, "ready")
    assert status["desiredTPU"] == "16"
    handle = kube.controller.handle_for(NS, "rc")
    assert handle is not None
    assert status["endpoints"]["dashboard"] == handle.dashboard_url.rsplit(":", 1)[1]
    assert status["head"]["serviceIP"] == "127.0.0.1" and status["head"]["serviceName"] == "rc-head-svc"
    svc = kube.store.get(SERVICES, NS, "rc-head-svc")
    assert {p["name"]: str(p["port"]) for p in svc["spec"]["ports"]} == status["endpoints"]
    [launched] = kube.launcher.launched  # type: ignore[attr-defined]
    shape = launched.spec.tpu  # the stand-in's own reading of the worker group's slice
    assert (shape.node_selector, shape.chips_per_host, shape.hosts, shape.slices) == (
        V6E.node_selector,
        V6E.chips_per_host,
        V6E.num_hosts,
        V6E.num_slices,
    )
    assert shape.machine_type == V6E.machine_type


def test_the_tpu_webhook_injects_the_tpu_worker_environment(kube: KubeRayStandin) -> None:
    kube.store.create(RAYCLUSTERS, NS, manifest("rc"))
    workers = until(
        lambda: kube.store.list(PODS, NS, "ray.io/cluster=rc,ray.io/node-type=worker"), lambda pods: len(pods) == 4
    )
    envs = {
        p["metadata"]["name"]: {e["name"]: e.get("value") for e in p["spec"]["containers"][0].get("env") or []}
        for p in workers
    }
    assert sorted(env["TPU_WORKER_ID"] for env in envs.values()) == ["0", "1", "2", "3"]
    assert len({env["TPU_NAME"] for env in envs.values()}) == 1  # one slice
    # Every host of the slice, by the hostname the webhook gave its pod under the headless Service.
    hostnames = {p["metadata"]["name"]: f"{p['spec']['hostname']}.{p['spec']['subdomain']}" for p in workers}
    for env in envs.values():
        assert sorted(env["TPU_WORKER_HOSTNAMES"].split(",")) == sorted(hostnames.values())
    for name, env in envs.items():
        assert env["TPU_WORKER_HOSTNAMES"].split(",")[int(env["TPU_WORKER_ID"])] == hostnames[name]
    assert {p["spec"]["subdomain"] for p in workers} == {"rc-headless"}
    headless = kube.store.get(SERVICES, NS, "rc-headless")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["selector"] == {"ray.io/cluster": "rc"}
    head = kube.store.list(PODS, NS, "ray.io/cluster=rc,ray.io/node-type=head")[0]
    assert not any(e["name"].startswith("TPU_") for e in head["spec"]["containers"][0].get("env") or [])


def test_a_pool_in_use_by_another_cluster_does_not_count(kube: KubeRayStandin) -> None:
    add_pool(kube, V6E)  # room for exactly one 4-host slice
    kube.store.create(RAYCLUSTERS, NS, manifest("first"))
    assert until(lambda: cluster_verdict(kube, "first"), lambda v: v.ready).ready
    kube.store.create(RAYCLUSTERS, NS, manifest("second"))
    events = until(lambda: kube.store.list(EVENTS, NS, field_selector="reason=FailedScheduling"), bool)
    assert "Insufficient google.com/tpu" in events[0]["message"]
    assert not cluster_verdict(kube, "second").ready


@pytest.mark.parametrize(
    "kube", [FakeRayLauncher(fail_with="ray start: GCS failed to bind 0.0.0.0:6379")], indirect=True
)
def test_a_head_that_cannot_start_reports_crashloop_and_logs(kube: KubeRayStandin) -> None:
    add_pool(kube, V6E)
    kube.store.create(RAYCLUSTERS, NS, manifest("rc"))
    verdict = until(lambda: cluster_verdict(kube, "rc"), lambda v: "GCS failed" in v.reason)
    assert "HeadPodReady=False" in verdict.reason and "GCS failed to bind" in verdict.reason
    head = kube.store.list(PODS, NS, "ray.io/node-type=head")[0]
    assert head["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert any("GCS failed" in line for line in kube.store.read_log(NS, head["metadata"]["name"]))


class FlakyLauncher(FakeRayLauncher):
    """Fails the first launch (a head that did not boot in time), then starts."""

    def launch(self, spec: Any) -> Any:
        if not getattr(self, "failed_once", False):
            self.failed_once = True
            raise RuntimeError("only 0 of 1 Ray nodes joined within 90s")
        return super().launch(spec)


@pytest.mark.parametrize("kube", [FlakyLauncher()], indirect=True)
def test_a_head_that_failed_to_start_is_restarted_after_a_backoff(kube: KubeRayStandin) -> None:
    kube.controller.restart_backoff = 0.2
    add_pool(kube, V6E)
    kube.store.create(RAYCLUSTERS, NS, manifest("rc"))
    assert until(lambda: cluster_verdict(kube, "rc"), lambda v: v.ready).ready
    head = kube.store.list(PODS, NS, "ray.io/node-type=head")[0]
    assert head["status"]["containerStatuses"][0]["restartCount"] == 1
    assert kube.store.list(EVENTS, NS, field_selector="reason=FailedToStartRayHead")


def test_delete_waits_for_the_ray_processes_then_collects_pods(kube: KubeRayStandin) -> None:
    add_pool(kube, V6E)
    kube.store.create(RAYCLUSTERS, NS, manifest("rc"))
    until(lambda: cluster_verdict(kube, "rc"), lambda v: v.ready)
    handle = kube.controller.handle_for(NS, "rc")
    kube.store.delete(RAYCLUSTERS, NS, "rc")
    assert until(lambda: kube.store.find(RAYCLUSTERS, NS, "rc"), lambda o: o is None) is None
    assert handle is not None and handle.stopped  # type: ignore[attr-defined]
    assert kube.store.list(PODS, NS) == [] and kube.store.list(SERVICES, NS) == []


def service_manifest(name: str = "svc", serve: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    return rayservice_manifest(RayClusterTemplate(V6E, image="img", **kw), serve or SERVE, name=name)


def service_verdict(kube: KubeRayStandin, name: str = "svc") -> Verdict:
    return rayservice_verdict(kube.store.find(RAYSERVICES, NS, name))


def test_rayservice_deploys_serve_config_and_becomes_ready(kube: KubeRayStandin) -> None:
    add_pool(kube, V6E)
    kube.store.create(RAYSERVICES, NS, service_manifest())
    assert until(lambda: service_verdict(kube), lambda v: v.ready).ready
    status = kube.store.get(RAYSERVICES, NS, "svc")["status"]
    cluster = status["activeServiceStatus"]["rayClusterName"]
    assert cluster.startswith("svc-raycluster-")
    assert status["activeServiceStatus"]["applicationStatuses"]["llm"]["serveDeploymentStatuses"] == {
        "LLMServer": {"status": "HEALTHY", "message": ""}
    }
    [handle] = kube.launcher.launched  # type: ignore[attr-defined]
    assert handle.deployed[0]["applications"] == SERVE["applications"]
    assert kube.store.find(SERVICES, NS, "svc-serve-svc") is not None

    # A new serveConfigV2 is applied in place: same cluster, no second slice.
    update = {"applications": [{**SERVE["applications"][0], "route_prefix": "/v2"}]}
    new_spec = service_manifest(serve=update)["spec"]
    kube.store.patch(
        RAYSERVICES, NS, "svc", {"spec": {"serveConfigV2": new_spec["serveConfigV2"]}}, "application/merge-patch+json"
    )
    until(lambda: len(handle.deployed), lambda n: n == 2)
    assert handle.deployed[-1]["applications"][0]["route_prefix"] == "/v2"
    assert until(lambda: service_verdict(kube), lambda v: v.ready).ready
    assert [o["metadata"]["name"] for o in kube.store.list(RAYCLUSTERS, NS)] == [cluster]

    kube.store.delete(RAYSERVICES, NS, "svc")
    assert until(lambda: kube.store.list(RAYCLUSTERS, NS), lambda items: not items) == []


@pytest.mark.parametrize(
    "kube",
    [
        FakeRayLauncher(
            serve={
                "llm": FakeServeBehaviour(
                    app_status="DEPLOYING",
                    deployment_message="Deployment 'LLMServer' has 1 replicas that have taken more than 30s "
                    "to be scheduled. Resources required for each replica: {'TPU': 4.0}",
                )
            }
        )
    ],
    indirect=True,
)
def test_rayservice_stuck_deploying_reports_the_deployment(kube: KubeRayStandin) -> None:
    add_pool(kube, V6E)
    kube.store.create(RAYSERVICES, NS, service_manifest())
    verdict = until(lambda: service_verdict(kube), lambda v: "LLMServer" in v.reason)
    assert (
        verdict.state == "waiting"
        and "'llm' is DEPLOYING" in verdict.reason
        and "taken more than 30s" in verdict.reason
    )


@pytest.mark.parametrize(
    "kube",
    [
        FakeRayLauncher(
            serve=FakeServeBehaviour(app_status="DEPLOY_FAILED", message="ModuleNotFoundError: No module named 'm'")
        )
    ],
    indirect=True,
)
def test_rayservice_deploy_failed_is_a_failure(kube: KubeRayStandin) -> None:
    add_pool(kube, V6E)
    kube.store.create(RAYSERVICES, NS, service_manifest())
    verdict = until(lambda: service_verdict(kube), lambda v: v.failed)
    assert verdict.failed and "ModuleNotFoundError" in verdict.reason


def test_rayservice_new_cluster_strategy_needs_a_second_slice(kube: KubeRayStandin) -> None:
    add_pool(kube, V6E)
    body = rayservice_manifest(RayClusterTemplate(V6E, image="img"), SERVE, name="svc", upgrade_strategy="NewCluster")
    kube.store.create(RAYSERVICES, NS, body)
    until(lambda: service_verdict(kube), lambda v: v.ready)
    new_cluster = RayClusterTemplate(V6E, image="img:2").cluster_spec()
    kube.store.patch(
        RAYSERVICES, NS, "svc", {"spec": {"rayClusterConfig": new_cluster}}, "application/merge-patch+json"
    )
    status = until(
        lambda: kube.store.get(RAYSERVICES, NS, "svc")["status"],
        lambda s: (s.get("pendingServiceStatus") or {}).get("rayClusterName"),
    )
    pending = status["pendingServiceStatus"]["rayClusterName"]
    events = until(lambda: kube.store.list(EVENTS, NS, field_selector="reason=FailedScheduling"), bool)
    assert pending and "Insufficient google.com/tpu" in events[0]["message"]
    assert not cluster_verdict(kube, pending).ready
    # the active cluster still serves the old spec: the upgrade is not done (KubeRay's UpgradeInProgress condition)
    upgrading = service_verdict(kube)
    assert upgrading.state == "waiting" and f"Ray cluster {pending} is to replace" in upgrading.reason, upgrading


@pytest.mark.parametrize("by_url", [False, True])
def test_tpu_workers_schedule_once_the_gke_standin_has_the_node_pool(tmp_path: Path, by_url: bool) -> None:
    import urllib.request

    from support.node_pool_plans import node_pool_plan

    from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
    from tpuflow_rehearsal.standins.kuberay_controller import GkeNodePools

    cluster = "projects/tpuflow-test/locations/us-east5/clusters/ml"
    with GKEApiStandin(operation_seconds=0.1) as gke:
        pools = GkeNodePools(gke.url if by_url else gke, cluster=cluster)
        with KubeRayStandin(tmp_path, launcher=FakeRayLauncher(), node_pools=pools, interval=0.05) as kube:
            kube.store.create(RAYCLUSTERS, NS, manifest("rc"))
            events = until(lambda: kube.store.list(EVENTS, NS, field_selector="reason=FailedScheduling"), bool)
            assert "didn't match Pod's node affinity/selector" in events[0]["message"]
            plan = node_pool_plan(
                project_id="tpuflow-test", location="us-east5", cluster_name="ml", node_zone="us-east5-b"
            )
            [body] = plan.bodies()
            request = urllib.request.Request(
                f"{gke.url}/v1/{cluster}/nodePools",
                method="POST",
                data=json.dumps({"nodePool": body}).encode(),
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=10).read()
            assert until(lambda: cluster_verdict(kube, "rc"), lambda v: v.ready, timeout=10).ready
            assert pools.matching_nodes(V6E.node_selector) == 4
