"""A simulated KubeRay operator (plus GKE's TPU webhook) reconciling objects in the Kubernetes stand-in.

RayCluster: the TPU webhook rule is enforced at admission (numOfHosts vs topology). The controller
creates the head pod, one pod per TPU host (replicas x numOfHosts) and the head Service. TPU worker pods
are scheduled only when the node-pool directory (the GKE stand-in) reports enough free nodes with the
worker group's node-selector labels; otherwise they stay Pending with a FailedScheduling event as on
GKE. Once every pod can be scheduled the controller launches a real Ray cluster through a
`ClusterLauncher` (normally the embedded `LocalRayCluster`: a head plus one simulated TPU host per pod,
built from the nodeSelector labels, google.com/tpu and numOfHosts) and reports KubeRay's status:
conditions RayClusterProvisioned / HeadPodReady, ready/desired worker replicas, status.head and
status.endpoints.

Addresses: the stand-in's pod network is the loopback interface. Every Ray head listens on free local
ports, so the head Service and status.endpoints carry those port numbers (where a real cluster has
8265/8000/6379) and status.head.podIP / serviceIP are 127.0.0.1: reading the head Service from outside
gives a reachable address, which is what a port-forward gives on GKE.

RayService: creates an owned RayCluster "<name>-raycluster-<hash>", PUTs serveConfigV2 to its dashboard
(/api/serve/applications/, as KubeRay does; http_options rewritten to the local serve port), mirrors
Serve's application and deployment statuses into activeServiceStatus and sets Ready when every app is
RUNNING and a proxy is healthy. serveConfigV2 changes are applied in place; rayClusterConfig changes
start a pending cluster only for upgradeStrategy NewCluster*, which needs a second set of TPU nodes.

Deletion: RayClusters carry a stand-in finalizer so the object disappears only after the Ray processes
stopped ("delete and wait until gone" is observable); owned pods/services/clusters are
garbage-collected through ownerReferences.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from operators.errors import UserInputError
from operators.kuberay.serve_config import parse_serve_config_v2
from operators.kuberay.status import raycluster_verdict
from operators.kuberay.webhook_rules import (
    WEBHOOK_DENIAL,
    WEBHOOK_NAME,
    node_selector,
    slice_of_group,
    tpu_group_problems,
    tpus_requested,
)
from operators.standins.kubernetes_api import (
    PODS,
    RAYCLUSTERS,
    RAYSERVICES,
    SERVICES,
    ApiError,
    ObjectStore,
    ResourceType,
    admission_denied,
    now_iso,
)
from operators.tpu import TpuSlice

FINALIZER = "tpuflow.dev/standin-ray-processes"
HEAD_SVC_SUFFIX = "-head-svc"


# --- the seams: node pools and Ray cluster launching ----------------------------------------------


class NodePoolDirectory(Protocol):
    """Which nodes exist (the GKE stand-in implements it)."""

    def matching_nodes(self, node_selector: Mapping[str, str]) -> int:
        """Number of nodes whose labels include every node_selector entry."""
        ...


@dataclass
class StaticNodePools:
    """A NodePoolDirectory from a fixed list of (labels, node count); `cpu_nodes` for the head."""

    pools: list[tuple[dict[str, str], int]] = field(default_factory=list)
    cpu_nodes: int = 1

    @classmethod
    def for_slice(cls, tpu: TpuSlice, slices: int | None = None) -> StaticNodePools:
        return cls([(dict(tpu.node_selector), tpu.num_hosts * (slices or tpu.num_slices))])

    def matching_nodes(self, node_selector: Mapping[str, str]) -> int:
        return sum(n for labels, n in self.pools if all(labels.get(k) == v for k, v in node_selector.items()))

    def total_nodes(self) -> int:
        return self.cpu_nodes + sum(n for _, n in self.pools)


@dataclass(frozen=True)
class LaunchSpec:
    """What a ClusterLauncher starts for one RayCluster."""

    key: str  # unique per RayCluster object: "<namespace>-<name>-<uid8>"
    namespace: str
    name: str
    tpu: TpuSlice | None
    env: dict[str, str]


class RayClusterHandle(Protocol):
    dashboard_url: str
    gcs_address: str
    serve_port: int

    def stop(self) -> None: ...

    def deploy_serve(self, config: dict[str, Any]) -> None: ...

    def serve_status(self) -> dict[str, Any]: ...

    def log_tail(self, role: str, lines: int) -> list[str]: ...


class ClusterLauncher(Protocol):
    def launch(self, spec: LaunchSpec) -> RayClusterHandle: ...


class LocalRayLauncher:
    """Launches the embedded LocalRayCluster: a head plus one simulated TPU host per worker pod.

    auth_mode "disabled" mirrors a KubeRay cluster without authOptions (dashboard and Serve REST without
    a token), so downstream tasks use the addresses from XCom as they would on GKE.
    """

    def __init__(self, base_dir: str | Path, *, head_cpus: int = 2, host_cpus: int = 1,
                 env: Mapping[str, str] | None = None, auth_mode: str = "disabled", timeout: float = 180.0) -> None:
        self.base_dir = Path(base_dir)
        self.head_cpus, self.host_cpus, self.timeout = head_cpus, host_cpus, timeout
        self.env = dict(env or {})
        self.auth_mode = auth_mode

    def launch(self, spec: LaunchSpec) -> RayClusterHandle:
        from operators.local.cluster import LocalRayCluster

        env = {**spec.env, **self.env, "RAY_AUTH_MODE": self.auth_mode}
        cluster = LocalRayCluster.start(spec.tpu, spec.key, self.base_dir, head_cpus=self.head_cpus,
                                        host_cpus=self.host_cpus, env=env, timeout=self.timeout, adopt=False)
        return LocalRayHandle(cluster)


class LocalRayHandle:
    """RayClusterHandle over a LocalRayCluster: Serve through the dashboard REST API, logs from node files."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.dashboard_url: str = cluster.dashboard_url
        self.gcs_address: str = cluster.gcs_address
        self.serve_port: int = cluster.serve_port

    def stop(self) -> None:
        self.cluster.stop()

    def deploy_serve(self, config: dict[str, Any]) -> None:
        import requests

        body = dict(config)
        body["http_options"] = {**(config.get("http_options") or {}), "host": "127.0.0.1", "port": self.serve_port}
        resp = requests.put(f"{self.dashboard_url}/api/serve/applications/", json=body,
                            headers=self.cluster.auth_headers(), timeout=60)
        if resp.status_code >= 400:
            raise RuntimeError(f"PUT /api/serve/applications/ -> {resp.status_code}: {resp.text[:500]}")

    def serve_status(self) -> dict[str, Any]:
        import requests

        resp = requests.get(f"{self.dashboard_url}/api/serve/applications/", headers=self.cluster.auth_headers(),
                            timeout=10)
        resp.raise_for_status()
        return dict(resp.json())

    def log_tail(self, role: str, lines: int) -> list[str]:
        for node in self.cluster.nodes:
            label = "head" if node.role == "head" else f"{node.slice_name}-w{node.worker_id}"
            if role in (label, node.role) or (role != "head" and label.endswith(role)):
                try:
                    return Path(node.log).read_text(errors="replace").splitlines()[-lines:]
                except OSError:
                    return []
        return []


@dataclass
class FakeServeBehaviour:
    """How the fake cluster's Serve reports every application after `delay` seconds."""

    app_status: str = "RUNNING"  # RUNNING | DEPLOYING | DEPLOY_FAILED | UNHEALTHY | NOT_STARTED
    message: str = ""
    deployment_message: str = ""
    delay: float = 0.0


_DEPLOYMENT_STATUS = {"RUNNING": "HEALTHY", "DEPLOYING": "UPDATING", "DEPLOY_FAILED": "DEPLOY_FAILED",
                      "UNHEALTHY": "UNHEALTHY"}


class FakeRayHandle:
    """No Ray processes: addresses on unused loopback ports and scripted Serve statuses."""

    def __init__(self, spec: LaunchSpec, serve: Mapping[str, FakeServeBehaviour], ports: tuple[int, int, int]) -> None:
        self.spec, self.serve = spec, serve
        self.dashboard_url = f"http://127.0.0.1:{ports[0]}"
        self.gcs_address = f"127.0.0.1:{ports[1]}"
        self.serve_port = ports[2]
        self.deployed: list[dict[str, Any]] = []
        self._deployed_at = 0.0
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def deploy_serve(self, config: dict[str, Any]) -> None:
        self.deployed.append(config)
        self._deployed_at = time.monotonic()

    def serve_status(self) -> dict[str, Any]:
        if not self.deployed:
            return {"applications": {}, "proxies": {}}
        elapsed = time.monotonic() - self._deployed_at
        apps = {}
        for app in self.deployed[-1].get("applications") or []:
            name = app.get("name", "default")
            script = self.serve.get(name) or self.serve.get("*") or FakeServeBehaviour()
            status = script.app_status if elapsed >= script.delay else "DEPLOYING"
            final = status == script.app_status
            deps = [d.get("name") for d in app.get("deployments") or [] if d.get("name")] or ["default"]
            dep_status = _DEPLOYMENT_STATUS.get(status, "UPDATING")
            apps[name] = {
                "status": status,
                "message": script.message if final else "",
                "deployments": {d: {"status": dep_status, "message": script.deployment_message if final else ""}
                                for d in deps},
            }
        return {"applications": apps, "proxies": {"head": {"status": "HEALTHY"}}}

    def log_tail(self, role: str, lines: int) -> list[str]:
        text = [f"[fake {role}] ray start --head (simulated, no Ray processes)", "[fake] Ray runtime started."]
        return text[-lines:]


class FakeRayLauncher:
    """A ClusterLauncher for tests that need KubeRay semantics but no Ray (fast, no processes)."""

    def __init__(self, *, launch_delay: float = 0.0,
                 serve: FakeServeBehaviour | Mapping[str, FakeServeBehaviour] | None = None,
                 fail_with: str | None = None) -> None:
        """serve: one behaviour for every application, or {application name | "*": behaviour}."""
        self.launch_delay, self.fail_with = launch_delay, fail_with
        self.serve: dict[str, FakeServeBehaviour] = (
            {"*": serve} if isinstance(serve, FakeServeBehaviour) else dict(serve or {"*": FakeServeBehaviour()}))
        self.launched: list[FakeRayHandle] = []
        self._next_port = 40000

    def launch(self, spec: LaunchSpec) -> RayClusterHandle:
        time.sleep(self.launch_delay)
        if self.fail_with:
            raise RuntimeError(self.fail_with)
        ports = (self._next_port, self._next_port + 1, self._next_port + 2)
        self._next_port += 3
        handle = FakeRayHandle(spec, self.serve, ports)
        self.launched.append(handle)
        return handle


# --- the GKE TPU webhook ------------------------------------------------------------------------------


def tpu_webhook(operation: str, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Admission: reject a TPU worker group whose numOfHosts does not match its topology."""
    spec = obj.get("spec") or {}
    if rtype.plural == "rayclusters":
        cluster_spec = spec
    elif rtype.plural == "rayservices":
        cluster_spec = spec.get("rayClusterConfig") or {}
    elif rtype.plural == "rayjobs":
        cluster_spec = spec.get("rayClusterSpec") or {}
    else:
        return
    if tpu_group_problems(cluster_spec):
        raise admission_denied(WEBHOOK_NAME, WEBHOOK_DENIAL)


# --- controller state ------------------------------------------------------------------------------


@dataclass
class _ClusterState:
    uid: str
    launching: threading.Thread | None = None
    handle: RayClusterHandle | None = None
    error: str | None = None
    stopping: bool = False
    provisioned: bool = False
    last_logs: float = 0.0


@dataclass
class _ServiceState:
    deployed_hash: dict[str, str] = field(default_factory=dict)  # cluster name -> serveConfigV2 hash
    serve: dict[str, dict[str, Any]] = field(default_factory=dict)  # cluster name -> last REST status
    polled: dict[str, float] = field(default_factory=dict)
    ever_ready: bool = False


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:5]


def _owner_ref(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj.get("apiVersion", "ray.io/v1"), "kind": obj.get("kind"), "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _involved(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"kind": obj.get("kind"), "name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid"),
            "apiVersion": obj.get("apiVersion")}


def _tpus_per_host(group: Mapping[str, Any]) -> int:
    return tpus_requested(group.get("template") or {})


class KubeRayController:
    """Reconciles RayClusters and RayServices in `store` in a background thread (start/stop)."""

    def __init__(self, store: ObjectStore, launcher: ClusterLauncher, node_pools: NodePoolDirectory | None = None,
                 *, interval: float = 0.2, serve_poll_interval: float = 0.5, install_webhook: bool = True) -> None:
        self.store, self.launcher = store, launcher
        self.node_pools: NodePoolDirectory = node_pools if node_pools is not None else StaticNodePools(cpu_nodes=1)
        self.interval, self.serve_poll_interval = interval, serve_poll_interval
        self._clusters: dict[tuple[str, str], _ClusterState] = {}
        self._services: dict[tuple[str, str], _ServiceState] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.event_interval = 5.0  # like the scheduler's backoff: repeat an event at most this often
        self._emitted: dict[tuple[str, ...], float] = {}
        if install_webhook and tpu_webhook not in store.admission:
            store.admission.append(tpu_webhook)

    # --- lifecycle ---
    def start(self) -> KubeRayController:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kuberay-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop reconciling and every Ray cluster this controller launched."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None
        with self._lock:
            states = list(self._clusters.values())
        for state in states:
            if state.launching is not None:
                state.launching.join(timeout=timeout)
            if state.handle is not None:
                with contextlib.suppress(Exception):
                    state.handle.stop()
                state.handle = None

    def __enter__(self) -> KubeRayController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile_once()
            except Exception as err:  # keep reconciling, like a controller-runtime loop
                self.errors.append(f"{type(err).__name__}: {err}")
            # Sleep until someone else changes the store (or a launch finishes), at most `interval`.
            self.store.wait_for_change(self.store.resource_version, self.interval)
            self._stop.wait(0.02)

    def handle_for(self, namespace: str, name: str) -> RayClusterHandle | None:
        state = self._clusters.get((namespace, name))
        return state.handle if state else None

    # --- reconciliation ---
    def reconcile_once(self) -> None:
        clusters = self.store.list(RAYCLUSTERS)
        live = set()
        for obj in clusters:
            live.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
            self._reconcile_cluster(obj)
        with self._lock:
            for key in [k for k in self._clusters if k not in live]:
                self._forget_cluster(key)
        for svc in self.store.list(RAYSERVICES):
            self._reconcile_service(svc)

    def _forget_cluster(self, key: tuple[str, str]) -> None:
        state = self._clusters.pop(key)
        if state.handle is not None:
            handle, state.handle = state.handle, None
            threading.Thread(target=handle.stop, daemon=True).start()

    def _event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str,
               component: str = "kuberay-operator") -> None:
        key = (obj["metadata"].get("uid", ""), reason, message)
        now = time.monotonic()
        if now - self._emitted.get(key, -1e9) < self.event_interval:
            return
        self._emitted[key] = now
        self.store.record_event(obj["metadata"]["namespace"], _involved(obj), kind, reason, message, component)

    def _reconcile_cluster(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        with self._lock:
            state = self._clusters.get((ns, name))
            if state is None or state.uid != meta["uid"]:
                if state is not None:
                    self._forget_cluster((ns, name))
                state = self._clusters[(ns, name)] = _ClusterState(uid=meta["uid"])
        if meta.get("deletionTimestamp"):
            self._finalize_cluster(obj, state)
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            self.store.mutate(RAYCLUSTERS, ns, name,
                              lambda o: o["metadata"].setdefault("finalizers", []).append(FINALIZER))
        spec = obj.get("spec") or {}
        groups = spec.get("workerGroupSpecs") or []
        tpu, tpu_problem = None, None
        tpu_groups = [g for g in groups if _tpus_per_host(g) > 0]
        if tpu_groups:
            try:
                tpu = slice_of_group(tpu_groups[0])
            except UserInputError as err:
                tpu_problem = str(err)
        if len(tpu_groups) > 1:
            self._event(obj, "Warning", "StandinLimitation", "the stand-in simulates only the first TPU worker group")
        pods = self._ensure_pods(obj, groups)
        self._ensure_head_service(obj, state)
        schedulable = self._schedule(obj, pods, tpu_groups, tpu_problem)
        if schedulable and state.handle is None and state.launching is None and state.error is None:
            self._launch(obj, state, tpu)
        self._update_pods(obj, state, pods, schedulable)
        self._update_cluster_status(obj, state)

    def _finalize_cluster(self, obj: dict[str, Any], state: _ClusterState) -> None:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        if state.stopping:
            return
        state.stopping = True

        def stop_then_release() -> None:
            if state.launching is not None:
                state.launching.join()
            if state.handle is not None:
                with contextlib.suppress(Exception):
                    state.handle.stop()
                state.handle = None
            for rtype in (PODS, SERVICES):
                for dep in self.store.list(rtype, ns, f"ray.io/cluster={name}"):
                    with contextlib.suppress(ApiError):
                        self.store.delete(rtype, ns, dep["metadata"]["name"])
            self.store.remove_finalizer(RAYCLUSTERS, ns, name, FINALIZER)

        threading.Thread(target=stop_then_release, name=f"finalize-{name}", daemon=True).start()

    # --- pods ---
    def _pod_labels(self, obj: Mapping[str, Any], template: Mapping[str, Any], node_type: str, group: str) -> dict[str, str]:
        labels = dict(((template.get("metadata") or {}).get("labels")) or {})
        labels.update({"ray.io/cluster": obj["metadata"]["name"], "ray.io/node-type": node_type, "ray.io/group": group,
                       "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "kuberay-operator"})
        return labels

    def _ensure_pods(self, obj: dict[str, Any], groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ns, name, uid = obj["metadata"]["namespace"], obj["metadata"]["name"], obj["metadata"]["uid"]
        existing = {p["metadata"]["name"]: p for p in self.store.list(PODS, ns, f"ray.io/cluster={name}")}
        wanted: list[tuple[str, dict[str, Any], dict[str, str], dict[str, Any]]] = []
        head_tpl = (obj.get("spec") or {}).get("headGroupSpec", {}).get("template") or {}
        wanted.append((f"{name}-head-{uid[:5]}", head_tpl, self._pod_labels(obj, head_tpl, "head", "headgroup"), {}))
        for group in groups:
            tpl = group.get("template") or {}
            gname = str(group.get("groupName", "workers"))
            hosts = int(group.get("numOfHosts", 1) or 1)
            for replica in range(int(group.get("replicas", 0) or 0)):
                for host in range(hosts):
                    pod_name = f"{name}-{gname}-worker-{uid[:3]}{replica}x{host}"
                    labels = self._pod_labels(obj, tpl, "worker", gname)
                    labels["tpuflow.dev/replica-index"], labels["tpuflow.dev/host-index"] = str(replica), str(host)
                    tpu_env = {"TPU_WORKER_ID": str(host), "TPU_NAME": f"{name}-{gname}-{replica}"}
                    wanted.append((pod_name, tpl, labels, tpu_env))
        pods = []
        for pod_name, tpl, labels, extra_env in wanted:
            if pod_name in existing:
                pods.append(existing[pod_name])
                continue
            pod_spec = json.loads(json.dumps(tpl.get("spec") or {}))
            containers = pod_spec.get("containers") or [{"name": "ray", "image": "unknown"}]
            for c in containers:
                c.setdefault("name", "ray")
                c.setdefault("image", "unknown")
            if extra_env:
                containers[0]["env"] = [*containers[0].get("env", []), *({"name": k, "value": v}
                                                                         for k, v in extra_env.items())]
            pod_spec["containers"] = containers
            body = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "namespace": ns, "labels": labels, "ownerReferences": [_owner_ref(obj)]},
                    "spec": pod_spec,
                    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}}
            pods.append(self.store.upsert(PODS, ns, body))
            self.store.append_log(ns, pod_name, [f"{now_iso()} pod created by the simulated KubeRay operator"])
        for stale in set(existing) - {w[0] for w in wanted}:
            with contextlib.suppress(ApiError):
                self.store.delete(PODS, ns, stale)
        return pods

    def _schedule(self, obj: dict[str, Any], pods: list[dict[str, Any]], tpu_groups: list[dict[str, Any]],
                  tpu_problem: str | None) -> bool:
        """True when every TPU worker pod fits on free matching nodes; otherwise FailedScheduling events."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        total = getattr(self.node_pools, "total_nodes", lambda: None)() or 1
        ok = True
        for group in tpu_groups:
            selector = node_selector(group)
            needed = int(group.get("replicas", 0) or 0) * int(group.get("numOfHosts", 1) or 1)
            matching = self.node_pools.matching_nodes(selector)
            used = self._tpu_nodes_in_use(selector, exclude=(ns, name))
            if tpu_problem is None and matching - used >= needed:
                continue
            ok = False
            labels = ", ".join(f"{k}={v}" for k, v in selector.items())
            if matching == 0 or tpu_problem:
                why = (f"0/{total} nodes are available: {total} node(s) didn't match Pod's node affinity/selector "
                       f"({labels}). preemption: 0/{total} nodes are available: {total} Preemption is not helpful "
                       "for scheduling.")
            else:
                why = (f"0/{total} nodes are available: {used} of {matching} matching node(s) already run TPU pods "
                       f"(Insufficient google.com/tpu), {total - matching} node(s) didn't match Pod's node "
                       "affinity/selector.")
            for pod in pods:
                if pod["metadata"]["labels"].get("ray.io/group") == group.get("groupName"):
                    self._event(pod, "Warning", "FailedScheduling", why, component="default-scheduler")
        return ok

    def _tpu_nodes_in_use(self, selector: Mapping[str, str], exclude: tuple[str, str]) -> int:
        used = 0
        for pod in self.store.list(PODS, None, "ray.io/node-type=worker"):
            owner = (pod["metadata"]["namespace"], pod["metadata"]["labels"].get("ray.io/cluster"))
            sel = (pod.get("spec") or {}).get("nodeSelector") or {}
            if owner != exclude and (pod.get("status") or {}).get("phase") == "Running" and all(
                    sel.get(k) == v for k, v in selector.items()):
                used += 1
        return used

    def _launch(self, obj: dict[str, Any], state: _ClusterState, tpu: TpuSlice | None) -> None:
        meta = obj["metadata"]
        head_containers = (((obj.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}).get(
            "spec", {}).get("containers") or [{}]
        env = {e["name"]: e["value"] for e in head_containers[0].get("env") or [] if "value" in e}
        spec = LaunchSpec(f"{meta['namespace']}-{meta['name']}-{meta['uid'][:8]}", meta["namespace"], meta["name"], tpu, env)

        def run() -> None:
            try:
                handle = self.launcher.launch(spec)
            except Exception as err:
                state.error = f"{type(err).__name__}: {err}"
            else:
                if state.stopping:
                    handle.stop()
                else:
                    state.handle = handle
            finally:
                state.launching = None
                with self.store.changed:
                    self.store.changed.notify_all()

        state.launching = threading.Thread(target=run, name=f"launch-{meta['name']}", daemon=True)
        state.launching.start()

    def _update_pods(self, obj: dict[str, Any], state: _ClusterState, pods: list[dict[str, Any]],
                     schedulable: bool) -> None:
        ns = obj["metadata"]["namespace"]
        for pod in pods:
            is_head = pod["metadata"]["labels"].get("ray.io/node-type") == "head"
            running = is_head or schedulable
            ready = (is_head and state.error is None) or (state.handle is not None and running)
            if state.error is not None and is_head:
                waiting = {"reason": "CrashLoopBackOff", "message": f"ray start failed: {state.error}"}
            elif not running:
                waiting = {"reason": "Unschedulable"}
            elif not ready:
                waiting = {"reason": "ContainerCreating"}
            else:
                waiting = None
            self._set_pod_status(ns, pod["metadata"]["name"], running, ready, waiting)
            if is_head and state.error is not None:
                self._event(obj, "Warning", "FailedToStartRayHead", f"ray start failed: {state.error.splitlines()[0]}")
                self.store.set_log(ns, pod["metadata"]["name"], [
                    f"{now_iso()} Starting Ray head (simulated KubeRay stand-in)", *state.error.splitlines()])
        handle = state.handle
        if handle is not None and time.monotonic() - state.last_logs > 1.0:
            state.last_logs = time.monotonic()
            for pod in pods:
                labels = pod["metadata"]["labels"]
                role = "head" if labels.get("ray.io/node-type") == "head" else \
                    f"slice-{labels.get('tpuflow.dev/replica-index', '0')}-w{labels.get('tpuflow.dev/host-index', '0')}"
                with contextlib.suppress(Exception):
                    lines = handle.log_tail(role, 200)
                    if lines:
                        self.store.set_log(ns, pod["metadata"]["name"], lines)

    def _set_pod_status(self, ns: str, pod_name: str, running: bool, ready: bool, waiting: dict[str, str] | None) -> None:
        def apply(pod: dict[str, Any]) -> None:
            containers = (pod.get("spec") or {}).get("containers") or []
            flag = "True" if ready else "False"
            status = pod.setdefault("status", {})
            status["phase"] = "Running" if running else "Pending"
            status["conditions"] = [{"type": "PodScheduled", "status": "True" if running else "False",
                                     **({} if running else {"reason": "Unschedulable"})},
                                    {"type": "Ready", "status": flag}, {"type": "ContainersReady", "status": flag}]
            if running:
                status["podIP"] = status["hostIP"] = "127.0.0.1"
                status.setdefault("startTime", now_iso())
            status["containerStatuses"] = [{
                "name": c.get("name", "ray"), "image": c.get("image", "unknown"), "imageID": "", "ready": ready,
                "restartCount": 0, "started": ready,
                "state": {"running": {"startedAt": status.get("startTime", now_iso())}} if waiting is None
                else {"waiting": waiting},
            } for c in containers]
        self.store.mutate(PODS, ns, pod_name, apply)

    def _ensure_head_service(self, obj: dict[str, Any], state: _ClusterState) -> None:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        ports = self._endpoints(obj, state)
        body = {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": f"{name}{HEAD_SVC_SUFFIX}", "namespace": ns,
                             "labels": {"ray.io/cluster": name, "ray.io/node-type": "head"},
                             "ownerReferences": [_owner_ref(obj)]},
                "spec": {"type": "ClusterIP", "clusterIP": "127.0.0.1",
                         "selector": {"ray.io/cluster": name, "ray.io/node-type": "head"},
                         "ports": [{"name": n, "port": int(p), "targetPort": int(p), "protocol": "TCP"}
                                   for n, p in ports.items()]}}
        current = self.store.find(SERVICES, ns, body["metadata"]["name"])
        if current is None or current.get("spec") != body["spec"]:
            self.store.upsert(SERVICES, ns, body)

    @staticmethod
    def _endpoints(obj: Mapping[str, Any], state: _ClusterState) -> dict[str, str]:
        """Port name -> port: the head container's declared ports, replaced by the live local ports."""
        head = (((obj.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec", {})
        containers = head.get("containers") or [{}]
        ports = {str(p.get("name")): str(p.get("containerPort")) for p in containers[0].get("ports") or []
                 if p.get("name")}
        handle = state.handle
        if handle is not None:
            live = {"dashboard": handle.dashboard_url.rsplit(":", 1)[1], "gcs": handle.gcs_address.rsplit(":", 1)[1],
                    "serve": str(handle.serve_port)}
            for declared in list(ports):
                if declared in ("gcs-server", "gcs"):
                    ports[declared] = live["gcs"]
                elif declared in live:
                    ports[declared] = live[declared]
                else:
                    ports.pop(declared)  # not simulated locally (client, metrics, ...)
            for key, value in live.items():
                ports.setdefault(key, value)
        return ports

    def _update_cluster_status(self, obj: dict[str, Any], state: _ClusterState) -> None:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        pods = self.store.list(PODS, ns, f"ray.io/cluster={name}")
        head = next((p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "head"), None)
        workers = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]

        def ready(pod: Mapping[str, Any] | None) -> bool:
            conds = ((pod or {}).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        groups = (obj.get("spec") or {}).get("workerGroupSpecs") or []
        desired = sum(int(g.get("replicas", 0) or 0) * int(g.get("numOfHosts", 1) or 1) for g in groups)
        ready_workers = sum(1 for w in workers if ready(w))
        head_ready = ready(head)
        all_ready = head_ready and ready_workers >= desired and state.handle is not None
        if all_ready:
            state.provisioned = True
        stamp = now_iso()
        tpus = sum(int(g.get("replicas", 0) or 0) * int(g.get("numOfHosts", 1) or 1) * _tpus_per_host(g) for g in groups)

        def cond(ctype: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
            return {"type": ctype, "status": "True" if ok else "False", "reason": reason, "message": message,
                    "observedGeneration": obj["metadata"].get("generation", 1)}

        head_reason = ("HeadPodRunningAndReady" if head_ready else
                       ("ContainersNotReady" if head is not None else "HeadPodNotFound"))
        head_message = "" if head_ready else (state.error or "the head pod is not ready")
        conditions = [
            cond("RayClusterProvisioned", state.provisioned,
                 "AllPodRunningAndReadyFirstTime" if state.provisioned else "RayClusterPodsProvisioning",
                 "" if state.provisioned else "RayCluster Pods are being provisioned for first time"),
            cond("HeadPodReady", head_ready, head_reason, head_message),
        ]
        status: dict[str, Any] = {
            "state": "ready" if all_ready else "",
            "desiredWorkerReplicas": desired, "minWorkerReplicas": desired, "maxWorkerReplicas": desired,
            "readyWorkerReplicas": ready_workers, "availableWorkerReplicas": ready_workers,
            "desiredCPU": "0", "desiredMemory": "0", "desiredGPU": "0", "desiredTPU": str(tpus),
            "observedGeneration": obj["metadata"].get("generation", 1),
            "head": {"podName": head["metadata"]["name"] if head else "", "serviceName": f"{name}{HEAD_SVC_SUFFIX}"},
            "conditions": conditions,
        }
        if head_ready:
            status["head"]["podIP"] = "127.0.0.1"
        if state.handle is not None:
            status["head"]["serviceIP"] = "127.0.0.1"
            status["endpoints"] = self._endpoints(obj, state)

        def apply(o: dict[str, Any]) -> None:
            old = o.get("status") or {}
            comparable = {k: v for k, v in old.items() if k not in ("lastUpdateTime", "stateTransitionTimes")}
            old_conds = {c["type"]: c for c in old.get("conditions") or []}
            for c in status["conditions"]:
                prev = old_conds.get(c["type"])
                c["lastTransitionTime"] = prev["lastTransitionTime"] if prev and prev.get("status") == c["status"] \
                    and prev.get("lastTransitionTime") else stamp
            if comparable == status:
                return
            new = dict(status)
            new["lastUpdateTime"] = stamp
            transitions = dict(old.get("stateTransitionTimes") or {})
            if new["state"] and new["state"] != old.get("state"):
                transitions[new["state"]] = stamp
            if transitions:
                new["stateTransitionTimes"] = transitions
            o["status"] = new

        self.store.mutate(RAYCLUSTERS, ns, name, apply)

    # --- RayService ---
    def _reconcile_service(self, svc: dict[str, Any]) -> None:
        meta = svc["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if meta.get("deletionTimestamp"):
            return
        state = self._services.setdefault((ns, name), _ServiceState())
        spec = svc.get("spec") or {}
        status = svc.get("status") or {}
        active = (status.get("activeServiceStatus") or {}).get("rayClusterName") or ""
        pending = (status.get("pendingServiceStatus") or {}).get("rayClusterName") or ""
        wanted_hash = _hash(spec.get("rayClusterConfig") or {})
        strategy = (spec.get("upgradeStrategy") or {}).get("type") or "NewCluster"
        if active and not self.store.find(RAYCLUSTERS, ns, active):
            active = ""
        if pending and not self.store.find(RAYCLUSTERS, ns, pending):
            pending = ""
        if not active and not pending:
            pending = self._create_service_cluster(svc, wanted_hash)
        elif active and not pending and strategy != "None":
            current = self.store.find(RAYCLUSTERS, ns, active) or {}
            if (current.get("metadata") or {}).get("annotations", {}).get("tpuflow.dev/standin-config-hash") != wanted_hash:
                pending = self._create_service_cluster(svc, wanted_hash)
        config_text = spec.get("serveConfigV2") or ""
        config_hash = _hash(config_text)
        for cluster_name in (c for c in (active, pending) if c):
            self._sync_serve(svc, state, cluster_name, config_text, config_hash)
        # Promote a pending cluster once its applications run (KubeRay switches traffic then).
        if pending and self._apps_running(state.serve.get(pending)):
            old_active, active, pending = active, pending, ""
            if old_active:
                with contextlib.suppress(ApiError):
                    self.store.delete(RAYCLUSTERS, ns, old_active)
        self._ensure_service_services(svc, active)
        self._update_service_status(svc, state, active, pending)

    def _ensure_service_services(self, svc: dict[str, Any], active: str) -> None:
        """KubeRay's "<name>-head-svc" and "<name>-serve-svc", following the active cluster's head."""
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        handle = self.handle_for(ns, active) if active else None
        if handle is None:
            return
        ports = {"head-svc": [("dashboard", handle.dashboard_url.rsplit(":", 1)[1]),
                              ("gcs", handle.gcs_address.rsplit(":", 1)[1]), ("serve", str(handle.serve_port))],
                 "serve-svc": [("serve", str(handle.serve_port))]}
        for suffix, named in ports.items():
            body = {"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": f"{name}-{suffix}", "namespace": ns,
                                 "labels": {"ray.io/originated-from-cr-name": name, "ray.io/cluster": active},
                                 "ownerReferences": [_owner_ref(svc)]},
                    "spec": {"type": "ClusterIP", "clusterIP": "127.0.0.1",
                             "selector": {"ray.io/cluster": active, "ray.io/node-type": "head"},
                             "ports": [{"name": n, "port": int(p), "targetPort": int(p), "protocol": "TCP"}
                                       for n, p in named]}}
            current = self.store.find(SERVICES, ns, body["metadata"]["name"])
            if current is None or current.get("spec") != body["spec"]:
                self.store.upsert(SERVICES, ns, body)

    def _create_service_cluster(self, svc: dict[str, Any], config_hash: str) -> str:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        cluster_name = f"{name}-raycluster-{_hash([svc['metadata']['uid'], config_hash])}"
        labels = {**(svc["metadata"].get("labels") or {}), "ray.io/originated-from-crd": "RayService",
                  "ray.io/originated-from-cr-name": name}
        body = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": cluster_name, "namespace": ns, "labels": labels,
                             "annotations": {"tpuflow.dev/standin-config-hash": config_hash},
                             "ownerReferences": [_owner_ref(svc)]},
                "spec": json.loads(json.dumps((svc.get("spec") or {}).get("rayClusterConfig") or {}))}
        try:
            self.store.create(RAYCLUSTERS, ns, body)
        except ApiError as err:
            if err.code != 409:
                self._event(svc, "Warning", "FailedToCreateRayCluster", err.message)
                return ""
        self._event(svc, "Normal", "CreatedRayCluster", f"Created RayCluster {ns}/{cluster_name}")
        return cluster_name

    def _sync_serve(self, svc: dict[str, Any], state: _ServiceState, cluster_name: str, config_text: str,
                    config_hash: str) -> None:
        ns = svc["metadata"]["namespace"]
        cluster = self.store.find(RAYCLUSTERS, ns, cluster_name)
        handle = self.handle_for(ns, cluster_name)
        if cluster is None or handle is None or not raycluster_verdict(cluster).ready:
            return
        if state.deployed_hash.get(cluster_name) != config_hash:
            try:
                config = parse_serve_config_v2(config_text)
                handle.deploy_serve(config)
            except Exception as err:
                self._event(svc, "Warning", "FailedToUpdateServeApplications",
                            f"Failed to update serve applications to the RayCluster {ns}/{cluster_name}: {err}")
                return
            state.deployed_hash[cluster_name] = config_hash
            state.polled.pop(cluster_name, None)
            self._event(svc, "Normal", "UpdatedServeApplications",
                        f"Updated serve applications to the RayCluster {ns}/{cluster_name}")
        if time.monotonic() - state.polled.get(cluster_name, 0.0) >= self.serve_poll_interval:
            state.polled[cluster_name] = time.monotonic()
            try:
                state.serve[cluster_name] = handle.serve_status()
            except Exception as err:
                self._event(svc, "Warning", "FailedToGetServeApplicationStatuses", str(err)[:300])

    @staticmethod
    def _apps_running(serve: Mapping[str, Any] | None) -> bool:
        apps = (serve or {}).get("applications") or {}
        return bool(apps) and all(a.get("status") == "RUNNING" for a in apps.values())

    @staticmethod
    def _app_statuses(serve: Mapping[str, Any] | None) -> dict[str, Any]:
        out = {}
        for app, st in ((serve or {}).get("applications") or {}).items():
            out[app] = {"status": st.get("status", ""), "message": st.get("message", "") or "",
                        "serveDeploymentStatuses": {
                            d: {"status": ds.get("status", ""), "message": ds.get("message", "") or ""}
                            for d, ds in (st.get("deployments") or {}).items()}}
        return out

    @staticmethod
    def _healthy_proxies(serve: Mapping[str, Any] | None) -> int:
        proxies = (serve or {}).get("proxies") or {}
        return sum(1 for p in proxies.values() if (p.get("status") if isinstance(p, Mapping) else p) == "HEALTHY")

    def _update_service_status(self, svc: dict[str, Any], state: _ServiceState, active: str, pending: str) -> None:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        active_serve = state.serve.get(active) if active else None
        endpoints = self._healthy_proxies(active_serve) if active and self._apps_running(active_serve) else 0
        ready = bool(active) and endpoints > 0
        state.ever_ready = state.ever_ready or ready
        reason = "NonZeroServeEndpoints" if ready else ("ZeroServeEndpoints" if state.ever_ready else "Initializing")
        generation = svc["metadata"].get("generation", 1)
        status: dict[str, Any] = {
            "activeServiceStatus": {"rayClusterName": active,
                                    "applicationStatuses": self._app_statuses(active_serve)} if active else {},
            "pendingServiceStatus": {"rayClusterName": pending,
                                     "applicationStatuses": self._app_statuses(state.serve.get(pending))}
            if pending else {},
            "numServeEndpoints": endpoints,
            "serviceStatus": "Running" if ready else "",
            "observedGeneration": generation,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": reason,
                 "message": "" if ready else ("Serve applications are not ready"
                                              if active or state.serve.get(pending) else
                                              "waiting for the RayCluster to be ready"),
                 "observedGeneration": generation},
                {"type": "UpgradeInProgress", "status": "True" if (active and pending) else "False",
                 "reason": "BothActivePendingClustersExist" if (active and pending) else "NoPendingCluster",
                 "message": "", "observedGeneration": generation},
            ],
        }
        # Only settle on the new generation's status once its config has been sent to the active cluster.
        if active and state.deployed_hash.get(active) != _hash((svc.get("spec") or {}).get("serveConfigV2") or ""):
            status["observedGeneration"] = max(int(generation) - 1, 0) if generation > 1 else generation
        stamp = now_iso()

        def apply(o: dict[str, Any]) -> None:
            old = o.get("status") or {}
            comparable = {k: v for k, v in old.items() if k != "lastUpdateTime"}
            old_conds = {c["type"]: c for c in old.get("conditions") or []}
            for c in status["conditions"]:
                prev = old_conds.get(c["type"])
                c["lastTransitionTime"] = prev["lastTransitionTime"] if prev and prev.get("status") == c["status"] \
                    and prev.get("lastTransitionTime") else stamp
            if comparable != status:
                o["status"] = {**status, "lastUpdateTime": stamp}

        self.store.mutate(RAYSERVICES, ns, name, apply)


def node_pools_from(obj: object) -> NodePoolDirectory:
    """Use any object with matching_nodes(node_selector) (the GKE stand-in) as the node-pool directory."""
    if not callable(getattr(obj, "matching_nodes", None)):
        raise TypeError(f"{type(obj).__name__} has no matching_nodes(node_selector) -> int")
    return obj  # type: ignore[return-value]



class KubeRayStandin:
    """The Kubernetes API stand-in plus the simulated KubeRay operator, ready for an Airflow connection.

        with KubeRayStandin(tmp_path, node_pools=gke_standin) as kube:
            os.environ.update(kube.connection_env("kube_standin"))
            ...  # KubeRay operators with kubernetes_conn_id="kube_standin"

    launcher defaults to the embedded LocalRayCluster (real Ray); tests without Ray pass FakeRayLauncher().
    """

    def __init__(self, workdir: str | Path, *, launcher: ClusterLauncher | None = None,
                 node_pools: NodePoolDirectory | None = None, interval: float = 0.2, namespace: str = "default") -> None:
        from operators.standins.kubernetes_api import KubernetesApiStandin

        self.workdir = Path(workdir)
        self.namespace = namespace
        self.api = KubernetesApiStandin()
        self.launcher = launcher if launcher is not None else LocalRayLauncher(self.workdir / "ray-clusters")
        self.controller = KubeRayController(self.api.store, self.launcher, node_pools, interval=interval)
        self.kubeconfig_path = self.workdir / "kubeconfig"

    @property
    def store(self) -> ObjectStore:
        return self.api.store

    def start(self) -> KubeRayStandin:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.api.start()
        self.api.write_kubeconfig(self.kubeconfig_path, self.namespace)
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()
        self.api.stop()

    def __enter__(self) -> KubeRayStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def connection_env(self, conn_id: str = "kubernetes_default") -> dict[str, str]:
        """AIRFLOW_CONN_<ID> for a kubernetes connection whose kube_config_path points here."""
        return self.api.airflow_connection_env(conn_id, self.kubeconfig_path, self.namespace)
