"""RayCluster / RayService manifests: CRD-valid, shaped like KubeRay's TPU samples, driven by the catalog."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from support.kuberay_crds import sample, schema_errors

from tpuflow.errors import UserInputError
from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest, rayservice_manifest
from tpuflow.kuberay.serve_config import parse_serve_config_v2
from tpuflow.kuberay.webhook_rules import tpu_group_problems
from tpuflow.kubernetes.ownership import ownership_labels, resource_name
from tpuflow.tpu import GENERATIONS, TpuSlice

IMAGE = "rayproject/ray:2.60.0-py311"
SERVE = {
    "applications": [
        {
            "name": "llm",
            "import_path": "workloads.serve_app:app",
            "route_prefix": "/",
            "deployments": [{"name": "LLMServer", "num_replicas": 1}],
        }
    ],
    "http_options": {"host": "127.0.0.1", "port": 52311, "request_timeout_s": 30},
}
ACCEPTANCE = [("v6e", "4x4"), ("v5e", "2x2"), ("tpu7x", "2x2x2")]


def cluster(accelerator: str, topology: str, **kw: Any) -> dict[str, Any]:
    tpu = TpuSlice.from_spec(accelerator, topology, num_slices=kw.pop("num_slices", 1))
    return raycluster_manifest(RayClusterTemplate(tpu, image=IMAGE, **kw), name="rc-test", namespace="ml")


def worker(manifest: dict[str, Any]) -> dict[str, Any]:
    spec = manifest["spec"].get("rayClusterConfig", manifest["spec"])
    [group] = spec["workerGroupSpecs"]
    return group


def container_ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


@pytest.mark.parametrize(("accelerator", "topology"), ACCEPTANCE)
def test_raycluster_validates_against_the_crd(accelerator: str, topology: str) -> None:
    assert schema_errors("rayclusters", cluster(accelerator, topology)) == []


@pytest.mark.parametrize(("accelerator", "topology"), ACCEPTANCE)
def test_rayservice_validates_against_the_crd(accelerator: str, topology: str) -> None:
    tpu = TpuSlice.from_spec(accelerator, topology)
    manifest = rayservice_manifest(RayClusterTemplate(tpu, image=IMAGE), SERVE, name="svc", namespace="ml")
    assert schema_errors("rayservices", manifest) == []


def test_crd_check_catches_a_misspelt_field() -> None:
    manifest = cluster("v6e", "4x4")
    worker(manifest)["numOfHost"] = 4
    worker(manifest)["replicas"] = "1"
    errors = schema_errors("rayclusters", manifest)
    assert any("numOfHost" in e and "pruned" in e for e in errors)
    assert any("replicas" in e and "integer" in e for e in errors)


@pytest.mark.parametrize(
    ("sample_file", "accelerator", "topology"),
    [
        ("ray-cluster.tpu-v6e-16-multihost.yaml", "v6e", "4x4"),
        ("ray-cluster.tpu-v6e-singlehost.yaml", "v6e", "2x2"),
        ("ray-cluster.tpu-v4-multihost.yaml", "v4", "2x2x2"),
    ],
)
def test_tpu_fields_match_the_kuberay_samples(sample_file: str, accelerator: str, topology: str) -> None:
    ours, theirs = cluster(accelerator, topology), sample(sample_file)
    ours_group, their_group = worker(ours), theirs["spec"]["workerGroupSpecs"][0]
    assert ours_group["numOfHosts"] == their_group["numOfHosts"]
    assert ours_group["replicas"] == their_group["replicas"]
    ours_pod, their_pod = ours_group["template"]["spec"], their_group["template"]["spec"]
    assert ours_pod["nodeSelector"] == their_pod["nodeSelector"]
    ours_res, their_res = ours_pod["containers"][0]["resources"], their_pod["containers"][0]["resources"]
    for part in ("requests", "limits"):
        assert ours_res[part]["google.com/tpu"] == their_res[part]["google.com/tpu"]
    head_ports = container_ports(ours["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0])
    sample_ports = container_ports(theirs["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0])
    for name, port in {"gcs": 6379, "dashboard": 8265, "client": 10001, "serve": 8000}.items():
        assert head_ports[name] == sample_ports[name] == port
    # Multi-host samples open the mxla port on workers; single-host ones do not need it.
    assert ("mxla" in container_ports(ours_pod["containers"][0])) == (ours_group["numOfHosts"] > 1)


def test_head_is_cpu_only_and_both_groups_mount_shm() -> None:
    manifest = cluster("v6e", "4x4", shm_size="16Gi")
    head = manifest["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    head_res = head["template"]["spec"]["containers"][0]["resources"]
    assert "google.com/tpu" not in head_res["requests"] and "nodeSelector" not in head["template"]["spec"]
    for pod in (head["template"]["spec"], worker(manifest)["template"]["spec"]):
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]


def test_tpu7x_declares_two_logical_devices_per_chip() -> None:
    manifest = cluster("tpu7x", "2x2x2", env={"JAX_PLATFORMS": "tpu"})
    group = worker(manifest)
    assert group["numOfHosts"] == 2
    assert json.loads(json.loads(group["rayStartParams"]["resources"])) == {"TPU": 8}
    for container in (
        manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0],
        group["template"]["spec"]["containers"][0],
    ):
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env == {"JAX_PLATFORMS": "tpu", "RAY_TPU_RESOURCE_PER_CHIP": "2"}
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] == "4"


def test_tpu_workers_drain_their_ray_node_on_a_termination_notice() -> None:
    """GKE gives a spot VM's pods 15 s of graceful shutdown; the hook drains the Ray node for preemption and
    holds it for them, so Ray Train sees the notice (tests/ray/test_drain.py runs the hook's check)."""
    group = worker(cluster("v6e", "4x4"))
    pod = group["template"]["spec"]
    hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"] and "ray drain-node --reason=DRAIN_NODE_REASON_PREEMPTION" in hook[2]
    assert "--deadline-remaining-seconds=15" in hook[2] and hook[2].endswith("sleep 15")
    assert pod["terminationGracePeriodSeconds"] == 20  # the hold plus Ray's own exit
    head = cluster("v6e", "4x4")["spec"]["headGroupSpec"]["template"]["spec"]
    assert "lifecycle" not in head["containers"][0] and "terminationGracePeriodSeconds" not in head
    longer = worker(cluster("v6e", "4x4", preemption_notice_s=110))["template"]["spec"]
    assert (
        longer["terminationGracePeriodSeconds"] == 115
        and "sleep 110" in longer["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2]
    )
    off = worker(cluster("v6e", "4x4", preemption_notice_s=None))["template"]["spec"]
    assert "lifecycle" not in off["containers"][0] and "terminationGracePeriodSeconds" not in off


def test_v6e_lets_kuberay_derive_the_tpu_resource() -> None:
    group = worker(cluster("v6e", "4x4"))
    assert "resources" not in group["rayStartParams"]


def test_replicas_are_slices_and_numofhosts_hosts_per_slice() -> None:
    group = worker(cluster("v6e", "4x4", num_slices=2))
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"], group["numOfHosts"]) == (2, 2, 2, 4)


def test_every_catalog_shape_passes_the_tpu_webhook_rule() -> None:
    checked = 0
    for gen in GENERATIONS.values():
        for topology in sorted(gen.gke_topologies & gen.ray_topologies)[:6]:
            tpu = TpuSlice.from_spec(gen.name, topology)
            spec = RayClusterTemplate(tpu, image=IMAGE).cluster_spec()
            assert tpu_group_problems(spec) == [], (gen.name, topology)
            assert worker({"spec": spec})["numOfHosts"] == tpu.num_hosts
            checked += 1
    assert checked >= 20


def test_the_webhook_rule_names_a_wrong_numofhosts() -> None:
    spec = cluster("v6e", "4x4")["spec"]
    spec["workerGroupSpecs"][0]["numOfHosts"] = 2
    [problem] = tpu_group_problems(spec)
    assert (problem.field, problem.num_of_hosts, problem.expected_hosts) == ("workerGroupSpecs[0].numOfHosts", 2, 4)
    assert "4x4" in problem.message


def test_image_env_and_labels_come_from_arguments() -> None:
    tpu = TpuSlice.from_spec("v5e", "2x2")
    manifest = raycluster_manifest(
        RayClusterTemplate(tpu, image="gcr.io/p/ray:1", env={"A": "1"}), name="rc", labels={"team": "ml"}
    )
    assert manifest["metadata"]["labels"] == {"team": "ml"}
    for container in (
        manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0],
        worker(manifest)["template"]["spec"]["containers"][0],
    ):
        assert container["image"] == "gcr.io/p/ray:1"
        assert container["env"] == [{"name": "A", "value": "1"}]
    assert worker(manifest)["template"]["metadata"]["labels"] == {"team": "ml"}


def test_serve_config_v2_is_the_local_serve_config_listening_for_kuberay() -> None:
    tpu = TpuSlice.from_spec("v6e", "4x4")
    manifest = rayservice_manifest(RayClusterTemplate(tpu, image=IMAGE), SERVE, name="svc")
    config = parse_serve_config_v2(manifest["spec"]["serveConfigV2"])
    assert config["applications"] == SERVE["applications"]
    assert config["http_options"] == {"host": "0.0.0.0", "port": 8000, "request_timeout_s": 30}
    assert manifest["spec"]["upgradeStrategy"] == {"type": "None"}


def test_serve_config_object_with_to_dict_is_accepted() -> None:
    class ServeConfig:
        def to_dict(self) -> dict[str, Any]:
            return {"applications": [{"name": "a", "import_path": "m:app"}]}

    manifest = rayservice_manifest(
        RayClusterTemplate(TpuSlice.from_spec("v5e", "2x2"), image=IMAGE), ServeConfig(), name="svc"
    )
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"][0]["import_path"] == "m:app"


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: RayClusterTemplate(TpuSlice.from_spec("v6e", "4x4"), image="").validated(), "image"),
        (
            lambda: RayClusterTemplate(TpuSlice.from_spec("v6e", "4x4"), image=IMAGE, ray_version="2.60").validated(),
            "ray_version",
        ),
        (
            lambda: RayClusterTemplate(
                TpuSlice.from_spec("tpu7x", "2x2x2"), image=IMAGE, env={"RAY_TPU_RESOURCE_PER_CHIP": "1"}
            ).validated(),
            "env['RAY_TPU_RESOURCE_PER_CHIP']",
        ),
        (
            lambda: RayClusterTemplate(
                TpuSlice.from_spec("v6e", "4x4"), image=IMAGE, worker_resources={"google.com/tpu": "8"}
            ).validated(),
            "worker_resources['google.com/tpu']",
        ),
        (
            lambda: RayClusterTemplate(
                TpuSlice.from_spec("v6e", "4x4"), image=IMAGE, head_resources={"memory": "lots"}
            ).validated(),
            "head_resources['memory']",
        ),
        (
            lambda: RayClusterTemplate(TpuSlice.from_spec("v6e", "4x4"), image=IMAGE, env={"1X": "a"}).validated(),
            "env['1X']",
        ),
        (lambda: cluster_named("Bad_Name"), "name"),
        (
            lambda: RayClusterTemplate(
                TpuSlice.from_spec("v6e", "4x4"), image=IMAGE, preemption_notice_s=0
            ).validated(),
            "preemption_notice_s",
        ),
        (
            lambda: rayservice_manifest(
                RayClusterTemplate(TpuSlice.from_spec("v5e", "2x2"), image=IMAGE),
                SERVE,
                name="svc",
                upgrade_strategy="Rolling",
            ),
            "upgrade_strategy",
        ),
        (
            lambda: rayservice_manifest(
                RayClusterTemplate(TpuSlice.from_spec("v5e", "2x2"), image=IMAGE), {"applications": []}, name="svc"
            ),
            "serve_config.applications",
        ),
        (
            lambda: rayservice_manifest(
                RayClusterTemplate(TpuSlice.from_spec("v5e", "2x2"), image=IMAGE),
                {"applications": [{"name": "a", "import_path": "m:a"}, {"name": "a", "import_path": "m:b"}]},
                name="svc",
            ),
            "serve_config.applications[1].name",
        ),
    ],
)
def test_bad_input_names_the_field(build: Any, field: str) -> None:
    with pytest.raises(UserInputError) as err:
        build()
    assert err.value.field == field
    assert err.value.fix


def cluster_named(name: str) -> dict[str, Any]:
    return raycluster_manifest(RayClusterTemplate(TpuSlice.from_spec("v5e", "2x2"), image=IMAGE), name=name)


def test_names_are_deterministic_per_task_instance_and_fit_kubernetes() -> None:
    a = resource_name("tpu_llm_pipeline_gke", "manual__2026-11-29T10:00:00+00:00", "ray_cluster")
    assert a == resource_name("tpu_llm_pipeline_gke", "manual__2026-11-29T10:00:00+00:00", "ray_cluster")
    assert a != resource_name("tpu_llm_pipeline_gke", "manual__2026-11-29T10:00:00+00:00", "ray_cluster", 1)
    assert len(a) <= 40 and a[0].isalpha() and a.replace("-", "").isalnum() and a == a.lower()
    labels = ownership_labels("My DAG/with:odd+chars" * 4, "scheduled__2026+x", "group.task_1")
    manifest = raycluster_manifest(
        RayClusterTemplate(TpuSlice.from_spec("v5e", "2x2"), image=IMAGE), name=a, labels=labels
    )
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tpuflow"
    assert all(len(v) <= 63 for v in labels.values())


@pytest.mark.parametrize("kind", ["RayCluster", "RayService"])
def test_the_expiry_label_is_on_the_object_not_its_pods(kind: str) -> None:
    """tpuflow-expires (what the orphan reaper reads) goes on the RayCluster/RayService only: a retry's later
    expiry leaves the spec, and its spec-hash annotation, alone (the retry adopts the earlier try's object)."""
    template = RayClusterTemplate(TpuSlice.from_spec("v6e", "4x4"), image=IMAGE)
    dag, run, task = "tpu_llm_pipeline_gke", "manual__2026-11-29T10:00:00+00:00", "ray_cluster"
    first, retry = (ownership_labels(dag, run, task, expires_at=at) for at in (1_900_000_000, 1_900_000_060))

    def build(labels: dict[str, str]) -> dict[str, Any]:
        if kind == "RayCluster":
            return raycluster_manifest(template, name="rc-test", namespace="ml", labels=labels)
        return rayservice_manifest(template, SERVE, name="rs-test", namespace="ml", labels=labels)

    manifest, again = build(first), build(retry)
    assert manifest["metadata"]["labels"]["tpuflow-expires"] == "1900000000"
    assert manifest["metadata"]["labels"]["tpuflow.dev/run-key"] == first["tpuflow.dev/run-key"]
    assert manifest["spec"] == again["spec"] and manifest["metadata"]["annotations"] == again["metadata"]["annotations"]
    spec = manifest["spec"].get("rayClusterConfig", manifest["spec"])
    for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
        pod = group["template"]["metadata"]["labels"]
        assert "tpuflow-expires" not in pod and pod["tpuflow.dev/run-key"] == first["tpuflow.dev/run-key"]
    assert schema_errors(f"{kind.lower()}s", manifest) == []
    # without expires_at (the render CLI, expires_after=None): no label
    assert "tpuflow-expires" not in build(ownership_labels(dag, run, task))["metadata"]["labels"]
