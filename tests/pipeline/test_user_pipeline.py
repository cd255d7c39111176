"""Issue 25's "done when": a team's own package and a DAG file of a dozen lines (tests/pipeline/user_pipeline.py),
run locally end to end (lease, ledger, teardown), then the same file on the GKE and Kubernetes stand-ins with
only configuration changed (the Variable tpuflow_backend plus the connections and Variables `tpuflow standins
env` prints). Names, model, steps and task layout are not the demo's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.gke_pipeline import load_dag_file, point_airflow_at, task_states, wait_until_empty
from support.user_pipeline import DAG_FILE, DAG_ID, write_user_project

pytestmark = pytest.mark.slow
# the slice preflight is tested on its own (tests/rayjob, tests/workloads/test_multislice.py): off for CI's time
CONF = {
    "topology": "2x2",
    "train_steps": 40,
    "num_train": 400,
    "num_eval": 100,
    "preflight": False,
    "learning_rate": 0.02,
}


@pytest.fixture
def user_dags(dags_folder: Path) -> Iterator[Path]:
    """The user's DAG file and package in the session's DAGs folder (dag.test() runs DAGs of a bundle)."""
    import shutil
    import sys

    dag_file = write_user_project(dags_folder)
    yield dag_file
    dag_file.unlink()
    shutil.rmtree(dags_folder / "acme_sales")
    for name in [m for m in sys.modules if m.split(".")[0] == "acme_sales"]:
        del sys.modules[name]


def parse(dag_file: Path) -> Any:
    return load_dag_file(dag_file, DAG_ID, poll=0.5)


def test_the_dag_file_is_short_and_names_no_backend() -> None:
    code = [line for line in DAG_FILE.splitlines() if line.strip()]
    assert len(code) <= 30 and "backend" not in DAG_FILE and "gke" not in DAG_FILE.lower()


def test_a_user_pipeline_runs_locally_then_on_the_standins_by_configuration(
    user_dags: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.local.cluster import _pids_referencing

    home = tmp_path / "home"
    monkeypatch.setenv("TPUFLOW_HOME", str(home))
    monkeypatch.setenv("TPUFLOW_OUTPUT_ROOT", str(tmp_path / "outputs"))
    monkeypatch.delenv("AIRFLOW_VAR_TPUFLOW_BACKEND", raising=False)

    # --- locally: the default backend ------------------------------------------------------------------
    dag = parse(user_dags)
    assert {"start_cluster", "stop_cluster"} <= set(dag.task_ids) and "create_node_pool" not in dag.task_ids
    assert not {"evaluate", "deploy", "smoke_test"} & set(dag.task_ids)  # steps the workload leaves out
    assert {"learning_rate", "topology", "resume"} <= set(dag.params)  # the workload's Param on the form
    run = dag.test(run_conf=CONF)
    states = task_states(run)
    assert run.state == "success", states
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    trained = tis["train"].xcom_pull(task_ids="train")
    assert trained["metrics"]["step"] == CONF["train_steps"] and trained["metrics"]["mse"] < 400, trained
    assert trained["metrics"]["learning_rate"] == 0.02  # the workload's own Param reached its train loop
    checkpoint = Path(trained["checkpoint"])
    assert (checkpoint / "weights.npy").is_file(), trained
    report = json.loads(next((tmp_path / "outputs" / DAG_ID).rglob("report.json")).read_text())
    assert (Path(report["output_dir"]) / "data" / "train").is_dir()
    # the ledger closed the 4-chip slice it billed; the lease was given back; the cluster is gone
    ledger = tis["chip_ledger"].xcom_pull(task_ids="chip_ledger")
    (entry,) = ledger["slices"]
    assert entry["chips"] == 4 and entry["open"] is False and ledger["chip_hours"] > 0, ledger
    assert report["ledger"] == ledger
    lease = tis["acquire_slice"].xcom_pull(task_ids="acquire_slice")
    assert lease and states["release_slice"] == "success"
    assert not list(home.glob("slice-leases/slot-*.json")), "the lease must be given back"
    assert not list(home.glob("clusters/*/state.json")) and _pids_referencing(str(home)) == []


# on the imitation: make test-long (make test runs a team's DAG on the real control plane in test_team_dag_gke_killed)
@pytest.mark.parametrize("launcher_kind", [pytest.param(k, marks=pytest.mark.long) for k in ("fake", "ray")])
def test_the_same_dag_file_on_the_standins_is_configuration_only(
    launcher_kind: str, user_dags: Path, gke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GKE's shape from the same file: the slice's node pool and RayCluster derive from the run's topology, the
    user's code is what the jobs ship, and every teardown leaves the stand-ins empty. The fake launcher has no
    Ray, so the first Ray job (prep) cannot run: the run fails there, as on a cluster whose Ray is unreachable;
    with real Ray clusters behind the simulated KubeRay (make test-long) the run succeeds."""
    from support.gke_pipeline import CLUSTER_PATH

    from tpuflow_rehearsal.standins.kuberay_controller import (
        FakeRayLauncher,
        GkeNodePools,
        KubeRayStandin,
        LocalRayLauncher,
    )
    from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS

    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))
    launcher = (
        FakeRayLauncher() if launcher_kind == "fake" else LocalRayLauncher(tmp_path / "ray", head_cpus=2, timeout=600)
    )
    kube = KubeRayStandin(
        tmp_path / "kube", launcher=launcher, node_pools=GkeNodePools(gke, cluster=CLUSTER_PATH), interval=0.1
    )
    with kube:
        point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
        monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BACKEND", "gke")
        dag = parse(user_dags)
        assert {"create_node_pool", "create_ray_cluster", "delete_node_pool"} <= set(dag.task_ids)
        assert "start_cluster" not in dag.task_ids and "deploy" not in dag.task_ids
        assert dag.get_task("train").runtime_env == {"py_modules": [str(user_dags.parent / "acme_sales")]}
        for task in dag.tasks:
            task.retries = 0
        applied: list[dict[str, Any]] = []  # every RayCluster as the apiserver admitted it

        def record(operation: str, rtype: Any, obj: dict[str, Any], old: Any) -> None:
            if operation == "CREATE" and rtype.plural == RAYCLUSTERS.plural:
                applied.append(json.loads(json.dumps(obj)))

        kube.store.admission.append(record)
        # a multi-host slice here: two ct6e-standard-4t hosts of 4 chips
        run = dag.test(run_conf={**CONF, "topology": "2x4", "machine_type": "ct6e-standard-4t"})
        states = task_states(run)
        if launcher_kind == "fake":
            assert states["prep"] == "failed" and states["train"] == "upstream_failed", states
        else:
            assert run.state == "success", states
            trained = {ti.task_id: ti for ti in run.get_task_instances()}["train"].xcom_pull(task_ids="train")
            assert trained["metrics"]["step"] == CONF["train_steps"], trained
            assert (Path(trained["checkpoint"]) / "weights.npy").is_file(), trained
        for task_id in ("check_params", "budget_guard", "create_node_pool", "create_ray_cluster"):
            assert states[task_id] == "success", states
        for task_id in ("delete_ray_cluster", "delete_prep_cluster", "delete_node_pool", "chip_ledger"):
            assert states[task_id] == "success", states
        created = [
            r["body"]["nodePool"] for r in gke.requests if r["method"] == "POST" and r["path"].endswith("/nodePools")
        ]
        (pool,) = created
        assert pool["config"]["machineType"] == "ct6e-standard-4t" and pool["initialNodeCount"] == 2, pool
        assert pool["placementPolicy"]["tpuTopology"] == "2x4", pool
        groups = [g for o in applied for g in o["spec"].get("workerGroupSpecs") or [] if "google.com/tpu" in str(g)]
        (group,) = groups
        assert group["numOfHosts"] == 2 and group["replicas"] == 1, group
        (container,) = group["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["google.com/tpu"] in (4, "4"), container
        assert group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x4"
        wait_until_empty(gke, kube)
        assert gke.node_pools() == [] and kube.store.list(RAYCLUSTERS) == []
