"""The fault matrix's control-plane rows (issue 46): a team's own DAG (a TPU slice's node pool, a RayCluster on
it, a Ray job on the slice's host, both teardowns) run through dag.test() on the real control plane
(tpuflow_rehearsal.rehearsal: real etcd, kube-apiserver, controller-manager, scheduler and KubeRay operator; GKE's API
and nodes played), while a piece of that control plane fails:

- kube-apiserver restarted while the RayCluster task waits for its cluster;
- etcd restarted then;
- the KubeRay operator SIGKILLed as soon as the RayCluster exists (mid-reconcile) and started again;
- the node agent killed while the job runs: every node dies with its pods' processes and comes back seconds later
  (a kubelet after a reboot starts the pods' containers again: the Ray head is a new one, the job is gone);
- the GKE API failing the pool's create mid-operation, then its delete, with 5xx (the task retried once);
- the Kubernetes API answering the DAG's requests with 429 on the RayCluster's create, 500 on its reads, 503 on its
  delete (the imitation's rows of tests/faults/matrix.py, here through tests/support/kube_fault_proxy.py in front
  of the real kube-apiserver).

Counted after each run, as in the other rows: what is left (node pools, workload policies, RayClusters,
RayServices, ProvisioningRequests, PodTemplates, pods, pod sandboxes), what was made twice (a node pool created
twice, a RayCluster of one task with two uids, a head or worker pod of one cluster made again) and Ray jobs
submitted twice to one Ray head. A run that fails says why in one line of its failed task's error.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.gke_pipeline import load_dag_file, task_states
from support.kube_fault_proxy import KubeFaultProxy

from faults.matrix import Outcome, raises_after_its_work, settled
from tpuflow.kuberay.manifests import AUTH_TOKEN_SECRET_KEY, auth_secret_name
from tpuflow_rehearsal.rehearsal import RehearsalStack

DAG_ID = "orbit_nightly_slice_check"
STAGES = ("slice_pool", "ray_on_slice", "tpu_check", "drop_ray", "drop_pool")
JOB_SECONDS = 15  # the job's task on the TPU host: long enough for a fault to land inside it

DAG_FILE = textwrap.dedent('''\
    """Airflow DAG: Orbit's nightly check that its TPU slice runs Ray work (a team's DAG, not tpuflow's)."""

    from datetime import timedelta

    from airflow.sdk import DAG
    from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator
    from tpuflow.kuberay.operators import KubeRayCreateClusterOperator, KubeRayDeleteClusterOperator
    from tpuflow.rayjob.operators import RaySubmitJobOperator
    from tpuflow.tpu import TpuSlice

    SLICE = TpuSlice.from_spec("v6e", "2x2")
    GKE = dict(project_id="{project}", location="{zone}", cluster_name="{cluster}", gcp_conn_id="orbit_gcp",
               deferrable=True, poll_interval=0.5)
    KUBE = dict(kubernetes_conn_id="orbit_kube", deferrable=True, poll_interval=0.5)
    CHECK = """
    import json, os, time
    import ray

    ray.init()

    @ray.remote(resources={{"TPU": 4}})
    def on_the_host():
        time.sleep({seconds})
        return os.environ.get("TPU_ACCELERATOR_TYPE")

    print("orbit: the slice answered", ray.get(on_the_host.remote()), flush=True)
    """

    with DAG("{dag_id}", schedule=None, tags=["orbit"]) as dag:
        pool = GKECreateTPUNodePoolOperator(task_id="slice_pool", tpu_slice=SLICE, **GKE)
        cluster = KubeRayCreateClusterOperator(task_id="ray_on_slice", tpu_slice=SLICE,
                                               image="rayproject/ray:2.60.0-py311", wait_timeout=300, **KUBE)
        check = RaySubmitJobOperator(task_id="tpu_check", cluster=cluster.output, entrypoint=["python", "-c", CHECK],
                                     working_dir="", poll_interval=0.5, job_timeout=240, unreachable_timeout=90,
                                     retries=1, retry_delay=timedelta(seconds=2))
        drop_ray = KubeRayDeleteClusterOperator(task_id="drop_ray", cluster_task_id="ray_on_slice", wait_timeout=180,
                                                **KUBE)
        drop_pool = GKEDeleteNodePoolOperator(task_id="drop_pool", created_by_task_id="slice_pool", **GKE)
        pool >> cluster >> check >> drop_ray.as_teardown(setups=cluster)
        drop_ray >> drop_pool.as_teardown(setups=pool)
''')


@dataclass
class Watch:
    """What the run made, polled every half second while it runs (the API server may be down for a while)."""

    stack: RehearsalStack
    clusters: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))  # name -> uids
    pods: dict[tuple[str, str], set[str]] = field(default_factory=lambda: collections.defaultdict(set))
    jobs: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))  # head pod uid -> ids
    head: dict[str, str] = field(default_factory=dict)  # the head pod's uid and address, once it has one
    pod_states: dict[str, str] = field(default_factory=dict)  # pod name -> its last phase, node and reasons seen
    token: str = ""  # the RayCluster's Ray token (KubeRay's Secret), to list its jobs
    error: str = ""  # the last poll's error (the API server restarting, the head gone)

    def poll(self) -> None:
        api = self.stack.api()
        for obj in api.items("/apis/ray.io/v1/rayclusters"):
            meta = obj["metadata"]
            self.clusters[meta["name"]].add(meta["uid"])
            secret = auth_secret_name(meta["name"], obj.get("spec") or {})
            if secret and not self.token:
                data = api.request("GET", f"/api/v1/namespaces/{meta['namespace']}/secrets/{secret}").get("data")
                self.token = base64.b64decode((data or {}).get(AUTH_TOKEN_SECRET_KEY, "")).decode()
        for pod in api.items("/api/v1/pods", labelSelector="ray.io/cluster"):
            labels = pod["metadata"].get("labels") or {}
            self.pods[(labels["ray.io/cluster"], labels.get("ray.io/group", ""))].add(pod["metadata"]["uid"])
            ip = (pod.get("status") or {}).get("podIP")
            self.pod_states[pod["metadata"]["name"]] = _pod_state(pod)
            if labels.get("ray.io/node-type") == "head" and ip:
                restarts = sum(int(c.get("restartCount") or 0) for c in pod["status"].get("containerStatuses") or [])
                self.head = {"uid": pod["metadata"]["uid"], "ip": ip, "restarts": str(restarts)}
        listed = self._jobs()
        if listed is not None:  # one Ray head: the head pod, until its containers start again
            incarnation = f"{self.head['uid']} restarted {self.head['restarts']} times"
            self.jobs[incarnation].update(j["submission_id"] for j in listed if j.get("submission_id"))

    def _jobs(self) -> list[dict[str, Any]] | None:
        """The Ray jobs the head knows (Ray's Jobs REST API, with the cluster's token), None when it cannot say."""
        if not self.head:
            return None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        request = urllib.request.Request(f"http://{self.head['ip']}:8265/api/jobs/", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                return list(json.load(answer))
        except (OSError, ValueError):
            return None

    def running_job(self) -> bool:
        return any(j.get("status") == "RUNNING" for j in self._jobs() or [])

    def duplicates(self) -> dict[str, int]:
        groups = collections.Counter(cluster for (cluster, _group) in self.pods)
        return {
            "rayclusters": sum(len(uids) - 1 for uids in self.clusters.values()),
            "ray_pods": sum(len(uids) - 1 for uids in self.pods.values()),
            "ray_jobs_on_one_head": sum(max(len(ids) - 1, 0) for ids in self.jobs.values()),
            "pod_groups": sum(n - 2 for n in groups.values() if n > 2),  # a head and the slice's worker group
        }


def _pod_state(pod: dict[str, Any]) -> str:
    """The pod as "Running on NODE ip IP", then what is not true or waiting yet (a failed run says where it got)."""
    status = pod.get("status") or {}
    reasons = [
        f"{c['type']}={c.get('reason') or c['status']}"
        for c in status.get("conditions") or []
        if c.get("status") != "True"
    ]
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            reasons.append(f"{container['name']} {waiting.get('reason')}: {waiting.get('message', '')}".strip())
    node = (pod.get("spec") or {}).get("nodeName") or "no node"
    return f"{status.get('phase')} on {node} ip {status.get('podIP') or '-'} {' '.join(reasons)}".strip()


@contextlib.contextmanager
def watching(stack: RehearsalStack) -> Iterator[Watch]:
    watch, stop = Watch(stack), threading.Event()

    def loop() -> None:
        while not stop.wait(0.5):
            try:
                watch.poll()
            except Exception as err:  # noqa: BLE001 - the API server restarting: the next round looks again
                watch.error = repr(err)

    thread = threading.Thread(target=loop, name="fault-watch", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join(timeout=10)


def _until(what: str, ok: Callable[[], bool], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if ok():
                return
        time.sleep(0.3)
    raise AssertionError(f"the fault's moment never came: {what} (after {timeout:.0f} s)")


def _raycluster_made_not_ready(stack: RehearsalStack) -> bool:
    clusters = stack.api().items("/apis/ray.io/v1/rayclusters")
    return bool(clusters) and all((c.get("status") or {}).get("state") != "ready" for c in clusters)


def _raycluster_exists(stack: RehearsalStack) -> bool:
    return bool(stack.api().items("/apis/ray.io/v1/rayclusters"))


Inject = Callable[[RehearsalStack, Watch, KubeFaultProxy | None], str]


def restart_mid_wait(component: str) -> Inject:
    def inject(stack: RehearsalStack, watch: Watch, proxy: KubeFaultProxy | None) -> str:
        _until("a RayCluster being made", lambda: _raycluster_made_not_ready(stack))
        stack.plane.restart(component)
        return f"{component} restarted while the RayCluster was not ready"

    return inject


def operator_killed_mid_reconcile(stack: RehearsalStack, watch: Watch, proxy: KubeFaultProxy | None) -> str:
    _until("a RayCluster", lambda: _raycluster_exists(stack), timeout=240)
    stack.plane.kill("kuberay-operator")
    time.sleep(5)
    stack.plane.restart("kuberay-operator")
    return "KubeRay operator SIGKILLed once the RayCluster existed, started again 5 s later"


def node_agent_killed_mid_job(stack: RehearsalStack, watch: Watch, proxy: KubeFaultProxy | None) -> str:
    _until("a running Ray job", watch.running_job, timeout=300)
    time.sleep(3)
    stack.kill_node_agent()
    time.sleep(3)
    stack.start_node_agent()
    return "the nodes died with their pods' processes mid-job and came back 3 s later"


def retried(task_id: str) -> Callable[[Any], None]:
    """The team gave the task one retry (a second later)."""

    def patch(dag: Any) -> None:
        dag.get_task(task_id).retries = 1
        dag.get_task(task_id).retry_delay = timedelta(seconds=1)

    return patch


def retried_and_raising_after_its_work(task_id: str) -> Callable[[Any], None]:
    """The task makes its object, then raises, on each of two tries: the retry must adopt what the first made."""

    def patch(dag: Any) -> None:
        retried(task_id)(dag)
        raises_after_its_work(task_id)(dag)

    return patch


def raised_after_its_create(stack: RehearsalStack, watch: Watch, proxy: KubeFaultProxy | None) -> str:
    _until("a RayCluster", lambda: _raycluster_exists(stack), timeout=240)
    return "the task raised after its create, on both tries"


def api_errors_answered(stack: RehearsalStack, watch: Watch, proxy: KubeFaultProxy | None) -> str:
    assert proxy is not None, "a row of Kubernetes API errors runs its DAG's connection through the fault proxy"
    wanted = sum(f.times for f in proxy.faults)
    _until("the API errors answered", lambda: len(proxy.fired) == wanted, timeout=300)
    return f"kube-apiserver's answers replaced by {', '.join(proxy.fired)}"


def gke_errors_answered(stack: RehearsalStack, watch: Watch, proxy: KubeFaultProxy | None) -> str:
    _until("the GKE API's errors answered", lambda: not stack.gke.faults(), timeout=300)
    return "the GKE API answered with the row's errors"


@dataclass(frozen=True)
class ControlPlaneFaultCase:
    stage: str
    fault: str
    inject: Inject
    recovers: bool
    ci: bool = False
    patch_dag: Callable[[Any], None] | None = None  # changes a task of the loaded DAG
    # (code, method, plural, times): errors the DAG's Kubernetes connection gets instead of the API server's answer
    api_errors: tuple[tuple[int, str, str, int], ...] = ()
    gke_errors: tuple[dict[str, Any], ...] = ()  # GKEApiStandin.add_fault's arguments, queued before the run
    pipeline = "real plane"

    @property
    def id(self) -> str:
        return f"{self.stage}-{self.fault}"


def _gke_error_retried(stage: str, fault: str, error: dict[str, Any]) -> ControlPlaneFaultCase:
    """GKE's stand-in answering a call of the stage's task with ``error``, the team having given the task a retry."""
    return ControlPlaneFaultCase(stage, fault, gke_errors_answered, True, patch_dag=retried(stage), gke_errors=(error,))


CASES = [
    ControlPlaneFaultCase("ray_on_slice", "kube-apiserver-restarted", restart_mid_wait("kube-apiserver"), True),
    ControlPlaneFaultCase("ray_on_slice", "etcd-restarted", restart_mid_wait("etcd"), True),
    ControlPlaneFaultCase("ray_on_slice", "kuberay-operator-killed", operator_killed_mid_reconcile, True),
    ControlPlaneFaultCase(
        "ray_on_slice",
        "exception-after-create",
        raised_after_its_create,
        False,
        patch_dag=retried_and_raising_after_its_work("ray_on_slice"),
    ),
    # make faults / test-long, for CI's time (about 2 min). It failed twice on a loaded machine: the head pod refused
    # for want of the default ServiceAccount (the plane's start now waits for it), and a first try whose 15 s
    # unreachable_timeout ended before the kubelet's restarted Ray head answered (now 90 s)
    ControlPlaneFaultCase("tpu_check", "node-agent-killed", node_agent_killed_mid_job, True),
    # GKE's API errors (the GKE stand-in, as in tests/faults/matrix.py), the team having given the task a retry
    _gke_error_retried("slice_pool", "gke-5xx-mid-create", {"kind": "internal", "stage": "operation"}),
    _gke_error_retried("drop_pool", "gke-5xx-on-delete", {"kind": "internal", "on": "delete"}),
    # Kubernetes API errors (tests/support/kube_fault_proxy.py), the imitation's rows of tests/faults/matrix.py
    ControlPlaneFaultCase(
        "ray_on_slice",
        "k8s-429-on-create",
        api_errors_answered,
        True,
        ci=True,
        api_errors=((429, "POST", "rayclusters", 2),),
    ),
    ControlPlaneFaultCase(
        "ray_on_slice", "k8s-500-on-read", api_errors_answered, True, api_errors=((500, "GET", "rayclusters", 2),)
    ),
    ControlPlaneFaultCase(
        "drop_ray", "k8s-503-on-delete", api_errors_answered, True, api_errors=((503, "DELETE", "rayclusters", 1),)
    ),
]


def control_plane_case_params() -> list[Any]:
    return [pytest.param(c, id=c.id, marks=() if c.ci else pytest.mark.long) for c in CASES]


def _leftovers(stack: RehearsalStack) -> dict[str, int]:
    def count() -> dict[str, int]:
        return dict(collections.Counter(item.rsplit(" ", 1)[0] for item in stack.leftovers()))

    return settled(count, timeout=60)


def run_control_plane_case(
    case: ControlPlaneFaultCase, stack: RehearsalStack, dags_folder: Path, monkeypatch: Any
) -> Outcome:
    for key, value in stack.airflow_connections("orbit_gcp", "orbit_kube").items():
        monkeypatch.setenv(key, value)
    with contextlib.ExitStack() as cleanup:
        proxy = None
        if case.api_errors:
            proxy = cleanup.enter_context(KubeFaultProxy(stack.plane, stack.workdir / f"fault-proxy-{case.fault}"))
            for code, method, plural, times in case.api_errors:
                proxy.add_fault(code, method, plural, times=times)
            for key, value in proxy.connection_env("orbit_kube").items():
                monkeypatch.setenv(key, value)
        for fault in case.gke_errors:
            stack.gke.add_fault(**fault)
        cleanup.callback(stack.gke.clear_faults)
        return _run_case(case, stack, dags_folder, proxy)


def _run_case(
    case: ControlPlaneFaultCase, stack: RehearsalStack, dags_folder: Path, proxy: KubeFaultProxy | None
) -> Outcome:
    path = dags_folder / f"{DAG_ID}.py"
    path.write_text(
        DAG_FILE.format(
            project=stack.project, zone=stack.zone, cluster=stack.cluster, dag_id=DAG_ID, seconds=JOB_SECONDS
        )
    )
    pools_before = _pools_created(stack)
    fired: list[str] = []
    try:
        dag = load_dag_file(path, DAG_ID, poll=0.5)
        if case.patch_dag is not None:
            case.patch_dag(dag)
        with watching(stack) as watch:
            injector = threading.Thread(target=lambda: fired.append(case.inject(stack, watch, proxy)), daemon=True)
            injector.start()
            run = dag.test()
            injector.join(timeout=30)
        states = task_states(run)
        outcome = Outcome(case, states.get(case.stage, "absent"), _leftovers(stack), watch.duplicates())
        outcome.run_state = str(run.state)
        outcome.made = {"node_pools": len(_pools_created(stack) - pools_before), "rayclusters": len(watch.clusters)}
        outcome.explanation = "\n".join(
            [
                f"fault: {fired[0] if fired else 'never fired'}",
                f"task states: {states}",
                f"seen: head {watch.head}, jobs {dict(watch.jobs)}, last error {watch.error or '-'}",
                f"pods: {watch.pod_states}",
                *_errors(run),
            ]
        )
        outcome.duplicates["node_pools"] = max(outcome.made["node_pools"] - 1, 0)
        return outcome
    finally:
        path.unlink(missing_ok=True)


def _pools_created(stack: RehearsalStack) -> set[str]:
    """Every node pool a create was asked for, by name: names are the run's, so a pool made twice is two names (a
    retry that creates again after GKE failed the first create makes the same one)."""
    return {
        o["targetLink"].rsplit("/", 1)[-1]
        for o in stack.gke.state()["operations"]
        if o["operationType"] == "CREATE_NODE_POOL"
    }


def _errors(run: Any) -> list[str]:
    """Each failed task's error as the task's log ends it (what a user reads first)."""
    out = []
    for ti in run.get_task_instances():
        if str(ti.state) == "failed":
            out.append(f"{ti.task_id}: failed")
    return out
