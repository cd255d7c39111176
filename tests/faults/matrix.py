"""The fault matrix: one run of `tpu_llm_pipeline_gke` on the stand-ins per (stage, fault), and the bill of
what each run left behind.

A case queues its fault in the stand-ins before the run (a GKE API error, a GKE operation that runs past
its deadline, a Kubernetes API error, a Ray head that cannot start, a quota too small for the slices) or makes a task raise once its work is done
(the create happened, then the task failed: its retry must adopt it and its teardown must find it);
the run goes through dag.test() like `airflow dags test`. The simulated KubeRay
runs no Ray (FakeRayLauncher), so every run fails at the first Ray job: what a case measures is its
stage (did it finish despite the fault: recovered) and, after the teardowns, what is still there.

Counted after each run: node pools, workload policies, RayClusters, RayServices, pods, ProvisioningRequests
and simulated Ray clusters never stopped (leaked), and node pools or RayClusters created twice
(duplicated). The table and the final line ``fault matrix: N cases, L leaked, D duplicated, R recovered``
print at the end of the session (tests/faults/conftest.py).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.gke_pipeline import CLUSTER_PATH, ZONE, load_dag, point_airflow_at, task_states

from tpuflow_rehearsal.standins.capacity import PROVISIONING_REQUESTS
from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, GkeNodePools, KubeRayStandin
from tpuflow_rehearsal.standins.kubernetes_api import PODS, RAYCLUSTERS, RAYSERVICES

CONF = {"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t"}
CLUSTER_DEADLINE = 20.0  # the Ray clusters' ready wait, test-sized


@dataclass(frozen=True)
class FaultCase:
    stage: str  # the task the fault hits
    fault: str
    inject: Callable[[GKEApiStandin, KubeRayStandin], None]
    recovers: bool  # whether the stage is expected to finish despite the fault
    launcher: Callable[[], FakeRayLauncher] = FakeRayLauncher
    ci: bool = False
    patch_dag: Callable[[Any], None] | None = None  # changes a task of the loaded DAG
    # a regional cluster and the zones its slices may use, in order (Variable tpuflow_gke_node_zone)
    zones: tuple[str, ...] = ()
    reclaimed: bool = False  # GKE ends the training pool's nodes at its maxRunDuration: the ledger bills until then
    pipeline = "gke"

    @property
    def id(self) -> str:
        return f"{self.stage}-{self.fault}"


@dataclass
class Outcome:
    case: Any  # a FaultCase here, a LocalFaultCase (tests/faults/local_matrix.py)
    stage_state: str
    leftovers: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    made: dict[str, int] = field(default_factory=dict)  # node pools and RayClusters the run created
    # the run's end state where the case is judged by the whole run (the real-Airflow rows: a task marked
    # success is not a recovery), or "reaped" where `tpuflow reap` cleaned up after a deleted run
    run_state: str | None = None
    explanation: str = ""  # task states and failed tasks' logs, for an assertion message
    ledger: dict[str, Any] | None = None  # the run's chip ledger (its chip_ledger XCom), where it has one

    @property
    def recovered(self) -> bool:
        if self.run_state is not None:
            return self.run_state == "success"
        return self.stage_state == "success"

    @property
    def leaked(self) -> bool:
        return any(self.leftovers.values())

    @property
    def duplicated(self) -> bool:
        return any(self.duplicates.values())

    def row(self) -> str:
        left = ", ".join(f"{k} {v}" for k, v in self.leftovers.items() if v) or "-"
        dup = ", ".join(f"{k} {v}" for k, v in self.duplicates.items() if v) or "-"
        if self.recovered:
            verdict = "recovered"
        elif self.run_state == "reaped":
            verdict = "reaped (tpuflow reap)"
        else:
            verdict = f"run {self.run_state}" if self.run_state else f"stage {self.stage_state}"
        stage = f"{self.case.pipeline}: {self.case.stage}"
        return f"{stage:<25} {self.case.fault:<28} {verdict:<22} leaked: {left:<16} duplicated: {dup}"


OUTCOMES: list[Outcome] = []  # every case run in this session, for the report


def run_case(case: FaultCase, dags_folder: Path, gke: GKEApiStandin, tmp_path: Path, monkeypatch: Any) -> Outcome:
    launcher = case.launcher()
    cluster_path = CLUSTER_PATH
    if case.zones:
        region = case.zones[0].rsplit("-", 1)[0]
        cluster_path = CLUSTER_PATH.replace(f"/locations/{ZONE}/", f"/locations/{region}/")
        gke.add_cluster(cluster_path)
    kube = KubeRayStandin(
        tmp_path / "kube", launcher=launcher, node_pools=GkeNodePools(gke, cluster=cluster_path), interval=0.1
    )
    with kube:
        point_airflow_at(monkeypatch, gke, kube, tmp_path / "outputs")
        if case.zones:
            monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_GKE_LOCATION", region)
            monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_GKE_NODE_ZONE", ",".join(case.zones))
        dag = load_dag(dags_folder, poll=0.3)
        for task_id in ("create_prep_cluster", "create_ray_cluster"):
            dag.get_task(task_id).wait_timeout = CLUSTER_DEADLINE
        case.inject(gke, kube)
        if case.patch_dag is not None:
            case.patch_dag(dag)
        run = dag.test(run_conf=CONF)
        states = task_states(run)
        landed = _landed(gke, run) if case.zones else ""
        leftovers = _leftovers(gke, kube, launcher)
        outcome = Outcome(case, states.get(case.stage, "absent"), leftovers, _duplicates(gke, kube), _made(gke, kube))
        outcome.explanation = landed
        (ledger,) = [
            ti.xcom_pull(task_ids="chip_ledger") for ti in run.get_task_instances() if ti.task_id == "chip_ledger"
        ]
        outcome.ledger = ledger
        return outcome


def _landed(gke: GKEApiStandin, run: Any) -> str:
    """Where the training slice landed: the create task's zone, and the zones its creates were sent to."""
    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == "create_node_pool"]
    result = ti.xcom_pull(task_ids="create_node_pool") or {}
    sent = [
        ((r.get("body") or {}).get("nodePool") or {}).get("locations", ["?"])[0]
        for r in gke.requests
        if r["method"] == "POST" and r["path"].endswith("/nodePools")
    ]
    return f"landed in {result.get('node_zone')} after creates in {', '.join(sent)}"


def _leftovers(gke: GKEApiStandin, kube: KubeRayStandin, launcher: FakeRayLauncher) -> dict[str, int]:
    """What is still there once the teardowns ran (owned objects are garbage-collected within seconds)."""

    def count() -> dict[str, int]:
        return {
            "node_pools": len(gke.node_pools()),
            "workload_policies": len(gke.compute.policies()),
            "rayclusters": len(kube.store.list(RAYCLUSTERS)),
            "rayservices": len(kube.store.list(RAYSERVICES)),
            "pods": len(kube.store.list(PODS)),
            "provisioning_requests": len(kube.store.list(PROVISIONING_REQUESTS)),
            "ray_clusters_running": sum(1 for handle in launcher.launched if not handle.stopped),
        }

    return settled(count)


def settled(count: Callable[[], dict[str, int]], timeout: float = 30.0) -> dict[str, int]:
    """What `count` says once nothing is left, or after `timeout` (teardowns finish asynchronously)."""
    deadline = time.monotonic() + timeout
    left = count()
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
        left = count()
    return left


def _made(gke: GKEApiStandin, kube: KubeRayStandin) -> dict[str, int]:
    from tpuflow.labels import TASK_ID_LABEL

    pools = {
        o["targetLink"].rsplit("/", 1)[-1]
        for o in gke.state()["operations"]
        if o["operationType"] == "CREATE_NODE_POOL"
    }
    events = kube.store.events_since(RAYCLUSTERS, None, 0) or []
    clusters = {
        (obj["metadata"].get("labels") or {}).get(TASK_ID_LABEL, "") for _, event, obj in events if event == "ADDED"
    }
    return {"node_pools": len(pools), **{f"raycluster:{task}": 1 for task in sorted(clusters)}}


def _duplicates(gke: GKEApiStandin, kube: KubeRayStandin) -> dict[str, int]:
    """Objects one task made more than once: node pools created (operation done) twice or under two names,
    RayClusters added twice (a second name for the same task, or re-created after a delete)."""
    from tpuflow.labels import GCE_TASK_LABEL, TASK_ID_LABEL

    done = collections.Counter(
        o["targetLink"].rsplit("/", 1)[-1]
        for o in gke.state()["operations"]
        if o["operationType"] == "CREATE_NODE_POOL" and o["status"] == "DONE" and not o.get("error")
    )
    pools_by_task: dict[str, set[str]] = collections.defaultdict(set)
    for request in gke.requests:
        pool = ((request.get("body") or {}).get("nodePool")) or {}
        if request["method"] == "POST" and done.get(pool.get("name", "")):
            task = ((pool.get("config") or {}).get("resourceLabels") or {}).get(GCE_TASK_LABEL, "")
            pools_by_task[task].add(pool["name"])
    events = kube.store.events_since(RAYCLUSTERS, None, 0)
    assert events is not None, "the stand-in no longer keeps this run's RayCluster events"
    added = collections.Counter(
        (obj["metadata"].get("labels") or {}).get(TASK_ID_LABEL, obj["metadata"]["name"])
        for _, event, obj in events
        if event == "ADDED"
    )
    return {
        "node_pools": sum(n - 1 for n in done.values()) + sum(len(names) - 1 for names in pools_by_task.values()),
        "rayclusters": sum(n - 1 for n in added.values()),
    }


def gke_fault(kind: str, **kwargs: Any) -> Callable[[GKEApiStandin, KubeRayStandin], None]:
    def inject(gke: GKEApiStandin, kube: KubeRayStandin) -> None:
        gke.add_fault(kind, **kwargs)

    return inject


def kube_fault(code: int, method: str, plural: str, times: int = 1) -> Callable[[GKEApiStandin, KubeRayStandin], None]:
    def inject(gke: GKEApiStandin, kube: KubeRayStandin) -> None:
        kube.api.add_fault(code, method, plural, times=times, retry_after=0)

    return inject


def crash_looping_head() -> FakeRayLauncher:
    return FakeRayLauncher(fail_with="ray start failed: the head's raylet exited (simulated)")


def zone_faults(kinds: dict[str, str]) -> Callable[[GKEApiStandin, KubeRayStandin], None]:
    def inject(gke: GKEApiStandin, kube: KubeRayStandin) -> None:
        for zone, kind in kinds.items():
            gke.add_fault(kind, zone=zone, times=10)

    return inject


def no_fault(gke: GKEApiStandin, kube: KubeRayStandin) -> None:
    return None


def quota_below_the_slice(gke: GKEApiStandin, kube: KubeRayStandin) -> None:
    gke.quotas.set("TPUS-PER-TPU-FAMILY-per-project-region", 4)  # the 2x4 slice needs 8 on-demand v6e chips


def operation_timeout(task_id: str, seconds: float) -> Callable[[Any], None]:
    """The task's GKE operation deadline, test-sized (the default is an hour)."""

    def patch(dag: Any) -> None:
        dag.get_task(task_id).operation_timeout = seconds

    return patch


def raises_after_its_work(task_id: str) -> Callable[[Any], None]:
    """The task does its work (its create happened), then raises: every try, so the run fails there."""

    def patch(dag: Any) -> None:
        task = dag.get_task(task_id)
        base = type(task)

        def after(name: str) -> Callable[..., Any]:
            def raising(self: Any, *args: Any, **kwargs: Any) -> Any:
                getattr(base, name)(self, *args, **kwargs)  # a deferral (TaskDeferred) passes through untouched
                raise RuntimeError(f"injected: {task_id} raised after its work was done")

            return raising

        methods = {name: after(name) for name in ("execute", "execute_complete") if hasattr(base, name)}
        # a subclass, not instance attributes: the task runner executes a rendered copy of the task
        task.__class__ = type(base.__name__, (base,), methods)

    return patch


def airflow_down_past_max_run(seconds: float = 2.0) -> Callable[[Any], None]:
    """Airflow (scheduler, workers, triggerer, reaper) down for longer than the training pool's maxRunDuration:
    the pool is made with a `seconds` one, and nothing runs for `seconds` + 1.5 after it (the next task starts
    that late). GKE ends the nodes by itself; the RayCluster then finds none, the run fails at the cluster's
    deadline and the teardowns delete the pool GKE emptied."""

    def patch(dag: Any) -> None:
        dag.get_task("create_node_pool").max_run_duration = seconds
        task = dag.get_task("create_ray_cluster")
        base = type(task)

        def execute(self: Any, context: Any) -> Any:
            time.sleep(seconds + 1.5)
            return base.execute(self, context)

        task.__class__ = type(base.__name__, (base,), {"execute": execute})

    return patch


def _create_past_its_deadline(fault: str, seconds: float, recovers: bool) -> FaultCase:
    """The node pool's create running ``seconds`` past the task's 2 s operation deadline."""
    create = "create_node_pool"
    return FaultCase(
        create, fault, gke_fault("stuck", seconds=seconds), recovers, patch_dag=operation_timeout(create, 2.0)
    )


# One row per stage; `ci` marks the slice make test runs (one transient fault per API: GKE's here, Kubernetes' on the
# real control plane in tests/faults/controlplane_matrix.py), make faults runs all.
CASES: list[FaultCase] = [
    FaultCase("create_node_pool", "gke-too-many-operations", gke_fault("too_many_operations"), recovers=True),
    FaultCase("create_node_pool", "gke-stockout", gke_fault("stockout", times=10), recovers=False),
    FaultCase("create_node_pool", "gke-5xx-mid-create", gke_fault("internal", stage="operation"), True, ci=True),
    FaultCase("create_node_pool", "gke-quota", gke_fault("quota", times=10), recovers=False),
    # A create running past the task's 2 s operation deadline: the try fails naming the operation (GKE cannot
    # cancel a create). Ending within the retry's 10 s delay, the retry adopts the pool; running on past both
    # tries, the run fails and the teardown deletes the pool once GKE ends the create.
    _create_past_its_deadline("gke-operation-slow", seconds=8.0, recovers=True),
    _create_past_its_deadline("gke-operation-stuck", seconds=30.0, recovers=False),
    FaultCase("create_ray_cluster", "k8s-429-on-create", kube_fault(429, "POST", "rayclusters", 2), recovers=True),
    FaultCase("create_ray_cluster", "k8s-500-on-read", kube_fault(500, "GET", "rayclusters", 2), recovers=True),
    FaultCase("create_ray_cluster", "head-crash-looping", no_fault, recovers=False, launcher=crash_looping_head),
    FaultCase("delete_node_pool", "gke-5xx-on-delete", gke_fault("internal", on="delete"), recovers=True),
    FaultCase("delete_ray_cluster", "k8s-503-on-delete", kube_fault(503, "DELETE", "rayclusters"), recovers=True),
    FaultCase("check_params", "quota-below-the-slice", quota_below_the_slice, recovers=False),
    FaultCase(
        "create_node_pool",
        "exception-after-create",
        no_fault,
        recovers=False,
        patch_dag=raises_after_its_work("create_node_pool"),
    ),
    FaultCase(
        "create_ray_cluster",
        "exception-after-create",
        no_fault,
        False,
        patch_dag=raises_after_its_work("create_ray_cluster"),
    ),
    FaultCase(
        "create_ray_cluster",
        "airflow-down-past-max-run",
        no_fault,
        recovers=False,
        patch_dag=airflow_down_past_max_run(),
        reclaimed=True,
    ),
    # A regional cluster with three zones: no room in the first, no quota in the second; the slice lands in the
    # third, and every later step (RayCluster, ledger, teardowns) follows it there.
    FaultCase(
        "create_node_pool",
        "zone-a-stockout-zone-b-quota",
        zone_faults({"us-east5-a": "stockout", "us-east5-b": "quota"}),
        recovers=True,
        zones=("us-east5-a", "us-east5-b", "us-east5-c"),
    ),
    FaultCase(
        "create_prep_cluster",
        "exception-after-create",
        no_fault,
        recovers=False,
        patch_dag=raises_after_its_work("create_prep_cluster"),
    ),
]


def case_params() -> list[Any]:
    return [pytest.param(case, id=case.id, marks=() if case.ci else pytest.mark.long) for case in CASES]
