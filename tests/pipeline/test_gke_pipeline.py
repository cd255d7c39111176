"""`tpu_llm_pipeline_gke` against the GKE API stand-in and the Kubernetes stand-in with simulated KubeRay.

The DAG file is the shipped one (the session's DAGs folder links dags/*.py); it is pointed at the
stand-ins only through Airflow connections and Variables (AIRFLOW_CONN_* / AIRFLOW_VAR_*), and run with
dag.test() (what `airflow dags test` runs: real task runner, XCom, triggers inline). The simulated
KubeRay starts a real local Ray cluster (a head plus one simulated TPU host per GKE node) for the
training RayCluster and another for the RayService, once the GKE stand-in has the matching node pool.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.airflow_context import task_context
from support.gke_pipeline import (
    CLUSTER,
    CLUSTER_PATH,
    DAG_ID,
    PROJECT,
    ZONE,
    load_dag,
    point_airflow_at,
    task_states,
    wait_until_empty,
)
from tpuflow.cost.ledger import rfc3339_to_unix
from tpuflow.dev.standins.gke_api import GKEApiStandin
from tpuflow.dev.standins.kuberay_controller import (
    FakeRayLauncher,
    GkeNodePools,
    KubeRayStandin,
    LaunchSpec,
    LocalRayLauncher,
    RayClusterHandle,
)
from tpuflow.dev.standins.kubernetes_api import RAYCLUSTERS, RAYSERVICES
from tpuflow.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]
ORDER = [
    "check_params",
    "budget_guard",
    "create_node_pool",
    "create_ray_cluster",
    "train",
    "evaluate",
    "build_serve_config",
    "deploy",
    "smoke_test",
    "write_report",
]
TEARDOWNS = [
    "delete_service",
    "delete_serve_provisioning_request",
    "delete_serve_node_pool",
    "delete_ray_cluster",
    "delete_provisioning_request",
    "delete_node_pool",
    "delete_prep_cluster",
    "chip_ledger",
]
# the training slice's teardowns: right after train, not after the report
TRAINING_SLICE_TEARDOWNS = ("delete_ray_cluster", "delete_provisioning_request", "delete_node_pool")


class RecordingLauncher(LocalRayLauncher):
    """LocalRayLauncher that remembers every cluster it started (to check their processes are gone)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clusters: list[Any] = []

    def launch(self, spec: LaunchSpec) -> RayClusterHandle:
        handle = super().launch(spec)
        self.clusters.append(handle.cluster)  # type: ignore[attr-defined]
        return handle


# --- the DAG's shape and its checks (no stand-ins) -------------------------------------------------------
def test_gke_pipeline_shape(migrated_airflow_db: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / f"{DAG_ID}.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag(DAG_ID)
    for up, down in zip(ORDER, ORDER[1:], strict=False):
        if (up, down) == ("evaluate", "build_serve_config"):
            assert "create_serve_node_pool" in dag.get_task(up).downstream_task_ids
        assert down in dag.get_task(up).downstream_task_ids, (up, down)
    assert "deploy" in dag.get_task("create_serve_node_pool").downstream_task_ids
    assert {t.task_id for t in dag.tasks if t.is_setup} == {
        "check_params",
        "create_prep_cluster",
        "create_node_pool",
        "create_ray_cluster",
        "create_serve_node_pool",
        "request_capacity",
        "request_serve_capacity",
    }
    assert {t.task_id for t in dag.tasks if t.is_teardown} == set(TEARDOWNS)
    for teardown in TEARDOWNS:
        # Every teardown has check_params among its setups: it runs even when its own create task failed.
        assert "check_params" in dag.get_task(teardown).upstream_task_ids
        upstream = dag.get_task(teardown).get_flat_relative_ids(upstream=True)
        if teardown in TRAINING_SLICE_TEARDOWNS:
            # the training slice goes once training is over: evaluation and serving never wait on it
            assert "train" in upstream and not {"evaluate", "deploy", "write_report"} & upstream, teardown
        else:
            assert "write_report" in upstream, teardown
    assert "delete_node_pool" in dag.get_task("delete_ray_cluster").downstream_task_ids
    assert "delete_serve_node_pool" in dag.get_task("delete_service").downstream_task_ids
    # prep runs on the CPU cluster while the TPU pool is created: neither waits for the other
    assert "prep" in dag.get_task("create_prep_cluster").downstream_task_ids
    assert "train" in dag.get_task("prep").downstream_task_ids
    prep_up = dag.get_task("prep").get_flat_relative_ids(upstream=True)
    assert "create_node_pool" not in prep_up and "create_ray_cluster" not in prep_up
    assert "prep" not in dag.get_task("create_node_pool").get_flat_relative_ids(upstream=True)
    assert dag.get_task("prep").cluster.operator.task_id == "create_prep_cluster"
    assert dag.get_task("evaluate").cluster.operator.task_id == "create_prep_cluster"
    # ... so it asks for no TPU there (a CPU-only cluster would never place a TPU actor)
    assert "--tpu-per-host" not in dag.get_task("evaluate").entrypoint
    assert dag.get_task("train").cluster.operator.task_id == "create_ray_cluster"
    # the ledger comes last, after every delete
    assert {"delete_node_pool", "delete_serve_node_pool", "delete_prep_cluster"} <= dag.get_task(
        "chip_ledger"
    ).upstream_task_ids
    # what reads the GKE API renders its connection from the Variable, as the node pool tasks do
    for task_id in ("chip_ledger", "train", "create_node_pool"):
        assert "gcp_conn_id" in dag.get_task(task_id).template_fields, task_id
    for task_id in ("create_ray_cluster", "create_prep_cluster", "deploy"):
        assert dag.get_task(task_id).retries == 0
    assert {"serve_topology", "keep_endpoint", "accelerator", "topology", "max_chip_hours"} <= set(dag.params)
    # queued capacity: the request comes after the pool and before the Ray pods that consume it, and goes
    # between the RayCluster and the pool; flex-start's wait holds training back
    for up, down in [
        ("create_node_pool", "request_capacity"),
        ("request_capacity", "create_ray_cluster"),
        ("request_capacity", "wait_for_flex_start"),
        ("wait_for_flex_start", "train"),
        ("create_serve_node_pool", "request_serve_capacity"),
        ("request_serve_capacity", "deploy"),
        ("delete_ray_cluster", "delete_provisioning_request"),
        ("delete_provisioning_request", "delete_node_pool"),
        ("delete_service", "delete_serve_provisioning_request"),
        ("delete_serve_provisioning_request", "delete_serve_node_pool"),
    ]:
        assert down in dag.get_task(up).downstream_task_ids, (up, down)
    for task_id, request in [("create_ray_cluster", "request_capacity"), ("deploy", "request_serve_capacity")]:
        assert request in dag.get_task(task_id).provisioning_request, task_id
    assert dag.get_task("request_capacity").node_pool_task_id == "create_node_pool"
    assert "max_run_duration_seconds" in dag.get_task("request_capacity").max_run_duration_seconds
    assert dag.params["max_run_duration_seconds"] is None


def test_prep_cluster_is_cpu_only() -> None:
    from tpuflow.kuberay.webhook_rules import tpu_worker_groups
    from tpuflow.pipeline.gke import prep_cluster_manifest

    manifest = prep_cluster_manifest("rayproject/ray:2.60.0-py311", {"A": "1"})
    spec = manifest["spec"]
    assert spec["workerGroupSpecs"] == [] and list(tpu_worker_groups(spec)) == []
    assert "name" not in manifest["metadata"]  # named per task instance, as its delete task finds it
    head = spec["headGroupSpec"]
    # Ray tasks (prep, evaluate) run on the head, so it declares its CPUs
    assert head["rayStartParams"]["num-cpus"] == head["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]


@pytest.mark.parametrize(
    ("accelerator", "topology", "expected"),
    [
        ("TPU-V6E", "", "1x1"),
        ("v5e", "", "1x1"),
        ("TPU-V4", "", "2x2x1"),
        ("tpu7x", "", "2x2x1"),
        ("TPU-V6E", "2x4", "2x4"),
    ],
)
def test_serve_slice_is_single_host(accelerator: str, topology: str, expected: str) -> None:
    from tpuflow.pipeline.gke import serve_slice

    tpu = serve_slice(accelerator, topology)
    assert tpu.topology == expected and tpu.num_hosts == 1


@pytest.mark.parametrize(
    ("accelerator", "topology", "fix"),
    [
        ("TPU-V6E", "16", "not a chip count"),  # a multi-host slice without its topology
        ("TPU-V6E", "2x2x1", "2D"),
        ("TPU-V6E", "16x32", "no such slice"),
        ("TPU-V5P", "1x1", "3D"),
    ],
)
def test_serve_slice_rejects(accelerator: str, topology: str, fix: str) -> None:
    from tpuflow.pipeline.gke import serve_slice

    with pytest.raises(UserInputError) as err:
        serve_slice(accelerator, topology)
    assert err.value.field == "params.serve_topology" and fix in str(err.value)


def test_serve_slice_may_be_multi_host() -> None:
    from tpuflow.pipeline.gke import check_gke_params

    tpu = check_gke_params({"accelerator": "TPU-V6E", "topology": "2x2", "framework": "jax", "accuracy_threshold": 0.9,
                            "serve_topology": "4x4"})["serve"]  # fmt: skip
    assert (tpu["topology"], tpu["num_hosts"], tpu["multi_host"], tpu["machine_type"]) == (
        "4x4",
        4,
        True,
        "ct6e-standard-4t",
    )


def run_context(task_id: str) -> dict[str, Any]:
    """The context of one task of the DAG run these teardown tests share."""
    return task_context(dag_id=DAG_ID, run_id="manual__keep", task_id=task_id)


@pytest.mark.parametrize("keep", [True, "True"])
def test_endpoint_teardowns_keep_without_touching_the_apis(keep: Any) -> None:
    from tpuflow.pipeline.gke import KeepableDeleteNodePoolOperator, KeepableDeleteServiceOperator

    # Connections that do not exist: keeping must not call anything.
    svc = KeepableDeleteServiceOperator(
        task_id="delete_service", service_task_id="deploy", keep=keep, kubernetes_conn_id="no_such_connection"
    )
    assert svc.execute(run_context("delete_service"))["kept"] is True
    pool = KeepableDeleteNodePoolOperator(
        task_id="delete_serve_node_pool",
        created_by_task_id="create_serve_node_pool",
        keep=keep,
        project_id=PROJECT,
        location=ZONE,
        cluster_name=CLUSTER,
        gcp_conn_id="no_such_connection",
    )
    assert pool.execute(run_context("delete_serve_node_pool"))["kept"] is True


@pytest.mark.parametrize("keep", [False, "False", None])
def test_endpoint_teardowns_delete_unless_kept(
    keep: Any, gke: GKEApiStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator
    from tpuflow.pipeline.gke import KeepableDeleteNodePoolOperator, KeepableDeleteServiceOperator

    kube = KubeRayStandin(tmp_path / "kube", launcher=FakeRayLauncher(), node_pools=GkeNodePools(gke), interval=0.05)
    with kube:
        point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
        gke.create_node_pool(
            PROJECT,
            ZONE,
            CLUSTER,
            {
                "nodePool": {
                    "name": "serve-pool",
                    "config": {"machineType": "ct6e-standard-1t"},
                    "initialNodeCount": 1,
                    "locations": [ZONE],
                }
            },
        )
        deploy = KubeRayDeployServiceOperator(
            task_id="deploy",
            accelerator="TPU-V6E",
            topology="1x1",
            image="rayproject/ray:2.60.0-py311",
            serve_config={"applications": [{"name": "addition", "import_path": "addition.serve_app:app_builder"}]},
            kubernetes_conn_id="kube_standin",
            poll_interval=0.1,
            wait_timeout=60,
        )
        deploy.execute(run_context("deploy"))
        svc = KeepableDeleteServiceOperator(
            task_id="delete_service",
            service_task_id="deploy",
            keep=keep,
            kubernetes_conn_id="kube_standin",
            poll_interval=0.1,
            wait_timeout=60,
        )
        result = svc.execute(run_context("delete_service"))
        assert result["existed"] is True and result["deleted"] is True
        assert kube.store.list(RAYSERVICES) == []
        pool = KeepableDeleteNodePoolOperator(
            task_id="delete_serve_node_pool",
            node_pool_name="serve-pool",
            keep=keep,
            project_id=PROJECT,
            location=ZONE,
            cluster_name=CLUSTER,
            gcp_conn_id="gke_standin",
            poll_interval=0.1,
            retry_backoff=0.1,
        )
        pool.execute(run_context("delete_serve_node_pool"))
        assert gke.node_pools() == []


# --- end to end on the stand-ins ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "capacity",
    # make test runs the queued run (its capacity tasks are no-ops on demand); make test-long the plain one
    [pytest.param("queued"), pytest.param("on-demand", marks=pytest.mark.long)],
)
def test_gke_pipeline_end_to_end_on_the_standins(
    capacity: str,
    dags_folder: Path,
    gke: GKEApiStandin,
    gcs_emulator: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every output in Cloud Storage, as on GKE: the output root is a bucket of the GCS emulator. With queued
    capacity the slice's ProvisioningRequest is Provisioned (after the stand-in's delay), the TPU pods consume
    it, the run completes and the teardown deletes the request with the pools."""
    from support.gcs_bucket import list_bucket
    from tpuflow.dev.gcs_emulator import ensure_buckets
    from tpuflow.dev.standins.capacity import POD_TEMPLATES, PROVISIONING_REQUESTS
    from tpuflow.storage import EMULATOR_ENV, read_text

    bucket = "tpuflow-gke-outputs"
    ensure_buckets(gcs_emulator.url, [bucket])
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)  # the Airflow side, and the stand-in's Ray processes
    launcher = RecordingLauncher(tmp_path / "ray", head_cpus=2, host_cpus=1, timeout=600)
    kube = KubeRayStandin(
        tmp_path / "kube", launcher=launcher, node_pools=GkeNodePools(gke, cluster=CLUSTER_PATH), interval=0.2
    )
    with kube:
        point_airflow_at(monkeypatch, gke, kube, f"gs://{bucket}/runs")
        monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_TPU_CAPACITY", capacity)
        dag = load_dag(dags_folder, poll=0.5)
        # The orchestration on GKE is what this run checks; the demo runs train the defaults behind the gate.
        conf = {
            "accelerator": "TPU-V6E",
            "topology": "2x2",
            "framework": "jax",
            "train_steps": 300,
            "accuracy_threshold": 0,
            "num_train": 3000,
        }
        started = time.time()
        run = dag.test(run_conf=conf)
        elapsed = time.time() - started
        states = task_states(run)
        assert run.state == "success", states
        assert set(states.values()) == {"success"}, states
        print(f"tpu_llm_pipeline_gke on the stand-ins: {elapsed:.0f}s")

        tis = {ti.task_id: ti for ti in run.get_task_instances()}
        cluster = tis["create_ray_cluster"].xcom_pull(task_ids="create_ray_cluster")
        assert cluster["dashboard_url"].startswith("http://127.0.0.1:") and cluster["slice"]["topology"] == "2x2"
        deployed = tis["deploy"].xcom_pull(task_ids="deploy")
        assert deployed["applications"] == {"addition": "RUNNING"}
        objects = list_bucket(bucket, f"runs/{DAG_ID}/")
        (run_dir,) = {n.rsplit("/", 1)[0] for n in objects if n.endswith("/report.json")}
        relative = [n[len(run_dir) + 1 :] for n in objects if n.startswith(run_dir + "/")]
        assert "data/_SUCCESS" in relative and any(n.startswith("data/train/") for n in relative), relative
        assert any(n.startswith("train/") and n.endswith("/meta.json") for n in relative), relative  # checkpoints
        assert "eval/jax.json" in relative and any(n.startswith("logs/") for n in relative), relative
        report = json.loads(read_text(f"gs://{bucket}/{run_dir}/report.json") or "{}")
        assert report["output_dir"] == f"gs://{bucket}/{run_dir}"
        assert 0 <= report["accuracy"] <= 1 and isinstance(report["sample_completion"], str)  # eval and the endpoint
        assert report["endpoint"] == f"{deployed['serve_url']}/addition/v1"

        # The ledger: per slice, chips x (delete end - create start) of the stand-in's own operations
        ledger = tis["chip_ledger"].xcom_pull(task_ids="chip_ledger")
        assert report["ledger"] == ledger
        operations = gke.state()["operations"]
        for entry, chips in zip(ledger["slices"], (4, 1), strict=True):
            (pool,) = entry["pools"]
            ops = {o["operationType"]: o for o in operations if o["targetLink"].endswith(f"/nodePools/{pool}")}
            start = rfc3339_to_unix(ops["CREATE_NODE_POOL"]["startTime"])
            end = rfc3339_to_unix(ops["DELETE_NODE_POOL"]["endTime"])
            assert entry["chips"] == chips and entry["open"] is False
            assert abs(entry["created_at"] - start) < 1 and abs(entry["deleted_at"] - end) < 1, (entry, ops)
        assert [s["role"] for s in ledger["slices"]] == ["train", "serve"]
        train = tis["train"].xcom_pull(task_ids="train")
        assert ledger["training_chip_hours"] == pytest.approx(4 * train["fit_s"] / 3600, rel=1e-3)
        print(f"chip-hours on the stand-ins: {ledger['chip_hours']:.5f} billed, ratio {ledger['chip_hours_ratio']}")

        # Node pools: the training slice (one ct6e-standard-4t node) and the serve slice (1x1), both deleted.
        created = [
            (r["body"] or {}).get("nodePool", {}).get("config", {}).get("machineType")
            for r in gke.requests
            if r["method"] == "POST" and r["path"].endswith("/nodePools")
        ]
        assert sorted(created) == ["ct6e-standard-1t", "ct6e-standard-4t"], gke.requests
        queued = [
            (r["body"] or {}).get("nodePool", {}).get("queuedProvisioning")
            for r in gke.requests
            if r["method"] == "POST" and r["path"].endswith("/nodePools")
        ]
        assert queued == [{"enabled": True}] * 2 if capacity == "queued" else not any(queued), queued
        requested = tis["request_capacity"].xcom_pull(task_ids="request_capacity")
        if capacity == "queued":
            # the slice's request, named for the run, was Provisioned before the RayCluster was made
            assert requested["name"] and "skipped" not in requested, requested
        else:
            assert requested["skipped"], requested
        wait_until_empty(gke, kube)
        assert gke.node_pools() == []
        assert kube.store.list(PROVISIONING_REQUESTS) == [] and kube.store.list(POD_TEMPLATES) == []
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []
        # Three Ray clusters were started (CPU prep, TPU training, then the RayService's); none is left.
        from tpuflow.local.cluster import _pids_referencing

        assert len(launcher.clusters) == 3
        for local in launcher.clusters:
            assert not local.is_alive() and _pids_referencing(local.temp_dir) == [], local.name
        assert kube.controller.errors == []


@pytest.mark.slow
def test_a_raycluster_that_never_becomes_ready_fails_the_run_and_teardown_deletes_everything(
    dags_folder: Path,
    gke: GKEApiStandin,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # The Kubernetes connection reaches a cluster whose nodes are not the GKE cluster's that got the slice's
    # node pool: the TPU worker pods stay Pending (FailedScheduling) and the RayCluster never becomes ready.
    other_cluster = f"projects/{PROJECT}/locations/{ZONE}/clusters/another-cluster"
    launcher = FakeRayLauncher()
    kube = KubeRayStandin(
        tmp_path / "kube", launcher=launcher, node_pools=GkeNodePools(gke, cluster=other_cluster), interval=0.1
    )
    with kube:
        point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
        dag = load_dag(dags_folder, poll=0.3)
        deadline = 20.0
        dag.get_task("create_ray_cluster").wait_timeout = deadline  # the configured deadline, test-sized
        started = time.time()
        run = dag.test(run_conf={"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t"})
        elapsed = time.time() - started
        states = task_states(run)
        assert run.state == "failed", states
        assert states["check_params"] == "success" and states["create_node_pool"] == "success"
        assert states["create_ray_cluster"] == "failed"
        assert {states[t] for t in ("train", "evaluate", "deploy", "smoke_test")} == {"upstream_failed"}
        assert {t: states[t] for t in TEARDOWNS} == dict.fromkeys(TEARDOWNS, "success"), states
        out = capfd.readouterr()
        text = out.out + out.err
        # A clear reason, within the deadline: KubeRay's state plus the scheduler's FailedScheduling event.
        assert "didn't match Pod's node affinity/selector" in text, text[-5000:]
        assert elapsed < deadline + 120, elapsed
        # The two-host pool existed while the cluster waited, then teardown removed the pool and the RayCluster.
        pools_created = [r for r in gke.requests if r["method"] == "POST" and r["path"].endswith("/nodePools")]
        assert len(pools_created) == 1
        assert gke.node_pools() == []
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []
        # only the CPU prep cluster ever started (it has no TPU workers to wait for)
        assert [handle.spec.tpu for handle in launcher.launched] == [None]


@pytest.mark.slow
@pytest.mark.long  # a DAG run of its own (about 2 min here); make test proves the wiring with the shape test
def test_queued_capacity_that_never_arrives_fails_at_the_deadline_and_teardown_leaves_nothing(
    dags_folder: Path,
    gke: GKEApiStandin,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from tpuflow.dev.standins.capacity import POD_TEMPLATES, PROVISIONING_REQUESTS

    gke.capacity.update({"queued": {"available": False, "failAfterSeconds": 3600}})
    kube = KubeRayStandin(
        tmp_path / "kube", launcher=FakeRayLauncher(), node_pools=GkeNodePools(gke, cluster=CLUSTER_PATH), interval=0.1
    )
    with kube:
        point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
        monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_TPU_CAPACITY", "queued")
        dag = load_dag(dags_folder, poll=0.3)
        dag.get_task("request_capacity").wait_timeout = 5.0  # the configured deadline, test-sized
        run = dag.test(
            run_conf={
                "accelerator": "TPU-V6E",
                "topology": "2x4",
                "machine_type": "ct6e-standard-4t",
                "max_run_duration_seconds": 3600,
            }
        )
        states = task_states(run)
        assert run.state == "failed", states
        assert states["create_node_pool"] == "success" and states["request_capacity"] == "failed", states
        assert states["create_ray_cluster"] == "upstream_failed" and states["train"] == "upstream_failed"
        assert {t: states[t] for t in TEARDOWNS} == dict.fromkeys(TEARDOWNS, "success"), states
        out = capfd.readouterr()
        text = out.out + out.err
        assert "Provisioned=False: CapacityIsNotFound" in text and "by the deadline" in text, text[-5000:]
        queued_pools = [r for r in gke.requests if r["method"] == "POST" and r["path"].endswith("/nodePools")]
        assert queued_pools and queued_pools[0]["body"]["nodePool"]["queuedProvisioning"] == {"enabled": True}
        assert gke.node_pools() == []
        assert kube.store.list(PROVISIONING_REQUESTS) == [] and kube.store.list(POD_TEMPLATES) == []
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []
        assert kube.capacity is not None and kube.capacity.errors == [] and kube.controller.errors == []


@pytest.mark.slow
def test_slices_above_the_projects_quota_fail_the_first_task_and_nothing_is_created(
    dags_folder: Path,
    gke: GKEApiStandin,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Two v6e 2x4 slices on spot need 16 preemptible chips; the project has 8 in the cluster's region.
    gke.quotas.set("PREEMPTIBLE-TPU-V6E-per-project-region", 8, region=ZONE.rsplit("-", 1)[0])
    launcher = FakeRayLauncher()
    kube = KubeRayStandin(
        tmp_path / "kube", launcher=launcher, node_pools=GkeNodePools(gke, cluster=CLUSTER_PATH), interval=0.1
    )
    with kube:
        point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
        monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_TPU_CAPACITY", "spot")
        dag = load_dag(dags_folder, poll=0.3)
        run = dag.test(
            run_conf={"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t", "num_slices": 2}
        )
        states = task_states(run)
        assert run.state == "failed", states
        assert states["check_params"] == "failed", states
        assert not [t for t, s in states.items() if s == "success"], states
        text = "".join(capfd.readouterr())
        assert (
            "params.num_slices=2 is invalid: the run needs 16 v6e chips at once (2 slices of 8 chips, v6e 2x4) "
            "in us-east5, but PREEMPTIBLE-TPU-V6E-per-project-region allows 8 (spot)"
        ) in text, text[-5000:]
        assert [r for r in gke.requests if r["method"] != "GET"] == []  # not one pool or policy create
        assert kube.store.list(RAYCLUSTERS) == [] and kube.store.list(RAYSERVICES) == []
        assert launcher.launched == []
