"""The simulated KubeRay operator: the reconcile loop and RayCluster reconciliation (see the package docstring)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from tpuflow_rehearsal.standins.capacity import CONSUME_ANNOTATION
from tpuflow_rehearsal.standins.gke_tpu import SliceShape
from tpuflow_rehearsal.standins.kuberay_controller import auth
from tpuflow_rehearsal.standins.kuberay_controller.seams import (
    ClusterLauncher,
    LaunchSpec,
    NodePoolDirectory,
    RayClusterHandle,
    StaticNodePools,
)
from tpuflow_rehearsal.standins.kuberay_controller.services import RayServiceReconciler
from tpuflow_rehearsal.standins.kuberay_controller.state import (
    ClusterState,
    ServiceState,
    desired_resources,
    involved,
    owner_ref,
    stamp_transitions,
    tpus_per_host,
)
from tpuflow_rehearsal.standins.kuberay_controller.webhook import (
    headless_service,
    pod_hostname,
    selector,
    slice_shape,
    tpu_webhook,
    worker_env,
)
from tpuflow_rehearsal.standins.kubernetes_api import (
    PODS,
    RAYCLUSTERS,
    RAYSERVICES,
    SERVICES,
    ApiError,
    ObjectStore,
    now_iso,
)

FINALIZER = "tpuflow.dev/standin-ray-processes"
HEAD_SVC_SUFFIX = "-head-svc"


def _node_name(pod: Mapping[str, Any]) -> str:
    """The simulated GKE node a pod is scheduled on: its pool's kind and the pod's place in its slice."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get("ray.io/node-type") == "head":
        return "gke-standin-default-pool-0"
    selector_ = (pod.get("spec") or {}).get("nodeSelector") or {}
    accel = selector_.get("cloud.google.com/gke-tpu-accelerator", "cpu")
    return (
        f"gke-standin-{accel}-{labels.get('ray.io/group', 'workers')}-"
        f"{labels.get('tpuflow.dev/replica-index', '0')}-{labels.get('tpuflow.dev/host-index', '0')}"
    )


class KubeRayController(RayServiceReconciler):
    """Reconciles RayClusters and RayServices in `store` in a background thread (start/stop)."""

    def __init__(
        self,
        store: ObjectStore,
        launcher: ClusterLauncher,
        node_pools: NodePoolDirectory | None = None,
        *,
        interval: float = 0.2,
        serve_poll_interval: float = 0.5,
        install_webhook: bool = True,
    ) -> None:
        self.store, self.launcher = store, launcher
        self.node_pools: NodePoolDirectory = node_pools if node_pools is not None else StaticNodePools(cpu_nodes=1)
        self.interval, self.serve_poll_interval = interval, serve_poll_interval
        self._clusters: dict[tuple[str, str], ClusterState] = {}
        self._services: dict[tuple[str, str], ServiceState] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.event_interval = 5.0  # like the scheduler's backoff: repeat an event at most this often
        self.restart_backoff = 10.0  # the kubelet's first CrashLoopBackOff delay; it doubles up to 5 minutes
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
            state.stopping = True  # a launch still in flight stops what it started itself
        for state in states:
            launching = state.launching
            if launching is not None:
                launching.join()  # bounded by the launcher's own timeout; never leave its processes behind
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

    def _event(
        self, obj: Mapping[str, Any], kind: str, reason: str, message: str, component: str = "kuberay-operator"
    ) -> None:
        key = (obj["metadata"].get("uid", ""), reason, message)
        now = time.monotonic()
        if now - self._emitted.get(key, -1e9) < self.event_interval:
            return
        self._emitted[key] = now
        self.store.record_event(obj["metadata"]["namespace"], involved(obj), kind, reason, message, component)

    def _reconcile_cluster(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        with self._lock:
            state = self._clusters.get((ns, name))
            if state is None or state.uid != meta["uid"]:
                if state is not None:
                    self._forget_cluster((ns, name))
                state = self._clusters[(ns, name)] = ClusterState(uid=meta["uid"])
        if meta.get("deletionTimestamp"):
            self._finalize_cluster(obj, state)
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            self.store.mutate(
                RAYCLUSTERS, ns, name, lambda o: o["metadata"].setdefault("finalizers", []).append(FINALIZER)
            )
        spec = obj.get("spec") or {}
        groups = spec.get("workerGroupSpecs") or []
        tpu_groups = [g for g in groups if tpus_per_host(g) > 0]
        tpu = slice_shape(tpu_groups[0]) if tpu_groups else None
        if len(tpu_groups) > 1:
            self._event(obj, "Warning", "StandinLimitation", "the stand-in simulates only the first TPU worker group")
        state.visible = state.handle
        if (spec.get("authOptions") or {}).get("enableK8sTokenAuth"):
            self._event(obj, "Warning", "StandinLimitation", "the stand-in does not simulate enableK8sTokenAuth")
        secret = auth.ensure_secret(self.store, obj)
        pods = self._ensure_pods(obj, groups, secret)
        self._ensure_head_service(obj, state)
        schedulable = self._schedule(obj, pods, tpu_groups)
        config_errors = self._container_config_errors(pods)
        retry = state.error is not None and time.monotonic() >= state.retry_at
        if (
            schedulable
            and not config_errors
            and state.handle is None
            and state.launching is None
            and (state.error is None or retry)
        ):
            self._launch(obj, state, tpu)
        self._update_pods(obj, state, pods, schedulable, config_errors)
        self._update_cluster_status(obj, state)

    def _finalize_cluster(self, obj: dict[str, Any], state: ClusterState) -> None:
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
            for rtype in (PODS, SERVICES, auth.SECRETS):
                for dep in self.store.list(rtype, ns, f"ray.io/cluster={name}"):
                    with contextlib.suppress(ApiError):
                        self.store.delete(rtype, ns, dep["metadata"]["name"])
            self.store.remove_finalizer(RAYCLUSTERS, ns, name, FINALIZER)

        threading.Thread(target=stop_then_release, name=f"finalize-{name}", daemon=True).start()

    # --- pods ---
    def _pod_labels(
        self, obj: Mapping[str, Any], template: Mapping[str, Any], node_type: str, group: str
    ) -> dict[str, str]:
        labels = dict(((template.get("metadata") or {}).get("labels")) or {})
        labels.update(
            {
                "ray.io/cluster": obj["metadata"]["name"],
                "ray.io/node-type": node_type,
                "ray.io/group": group,
                "ray.io/is-ray-node": "yes",
                "app.kubernetes.io/created-by": "kuberay-operator",
            }
        )
        return labels

    def _ensure_pods(
        self, obj: dict[str, Any], groups: list[dict[str, Any]], auth_secret: str | None = None
    ) -> list[dict[str, Any]]:
        ns, name, uid = obj["metadata"]["namespace"], obj["metadata"]["name"], obj["metadata"]["uid"]
        existing = {p["metadata"]["name"]: p for p in self.store.list(PODS, ns, f"ray.io/cluster={name}")}
        # (pod name, template, labels, webhook env, webhook spec fields)
        wanted: list[tuple[str, dict[str, Any], dict[str, str], dict[str, str], dict[str, str]]] = []
        head_tpl = (obj.get("spec") or {}).get("headGroupSpec", {}).get("template") or {}
        wanted.append(
            (f"{name}-head-{uid[:5]}", head_tpl, self._pod_labels(obj, head_tpl, "head", "headgroup"), {}, {})
        )
        for group in groups:
            tpl = group.get("template") or {}
            gname = str(group.get("groupName", "workers"))
            hosts = int(group.get("numOfHosts", 1) or 1)
            for replica in range(int(group.get("replicas", 0) or 0)):
                for host in range(hosts):
                    pod_name = f"{name}-{gname}-worker-{uid[:3]}{replica}x{host}"
                    labels = self._pod_labels(obj, tpl, "worker", gname)
                    labels["tpuflow.dev/replica-index"], labels["tpuflow.dev/host-index"] = str(replica), str(host)
                    # The TPU webhook's pod mutation (TPU pods only): environment, hostname under the headless Service.
                    tpu_env, naming = {}, {}
                    if tpus_per_host(group):
                        tpu_env = worker_env(name, group, replica, host)
                        naming = {"hostname": pod_hostname(group, replica, host), "subdomain": headless_service(name)}
                    wanted.append((pod_name, tpl, labels, tpu_env, naming))
        if any(naming for *_, naming in wanted):
            self._ensure_headless_service(obj)
        pods = []
        for pod_name, tpl, labels, extra_env, naming in wanted:
            if pod_name in existing:
                pods.append(existing[pod_name])
                continue
            pod_spec = json.loads(json.dumps(tpl.get("spec") or {}))
            pod_spec.update(naming)
            containers = pod_spec.get("containers") or [{"name": "ray", "image": "unknown"}]
            for c in containers:
                c.setdefault("name", "ray")
                c.setdefault("image", "unknown")
                if auth_secret:
                    c["env"] = auth.with_auth_env(c.get("env") or [], auth_secret)
            if extra_env:
                containers[0]["env"] = [
                    *containers[0].get("env", []),
                    *({"name": k, "value": v} for k, v in extra_env.items()),
                ]
            pod_spec["containers"] = containers
            pod_meta: dict[str, Any] = {
                "name": pod_name,
                "namespace": ns,
                "labels": labels,
                "ownerReferences": [owner_ref(obj)],
            }
            annotations = (tpl.get("metadata") or {}).get("annotations")
            if annotations:
                pod_meta["annotations"] = dict(annotations)
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": pod_meta,
                "spec": pod_spec,
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]},
            }
            pods.append(self.store.upsert(PODS, ns, body))
            self.store.append_log(ns, pod_name, [f"{now_iso()} pod created by the simulated KubeRay operator"])
            role = "head" if labels.get("ray.io/node-type") == "head" else "worker"
            self._event(obj, "Normal", f"Created{role.capitalize()}Pod", f"Created {role} Pod {ns}/{pod_name}")
        for stale in set(existing) - {w[0] for w in wanted}:
            with contextlib.suppress(ApiError):
                self.store.delete(PODS, ns, stale)
        return pods

    def _schedule(self, obj: dict[str, Any], pods: list[dict[str, Any]], tpu_groups: list[dict[str, Any]]) -> bool:
        """True when every TPU worker pod fits on free matching nodes; otherwise FailedScheduling events."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        total = getattr(self.node_pools, "total_nodes", lambda: None)() or 1
        ok = True
        for group in tpu_groups:
            wanted = selector(group)
            needed = int(group.get("replicas", 0) or 0) * int(group.get("numOfHosts", 1) or 1)
            annotations = ((group.get("template") or {}).get("metadata") or {}).get("annotations") or {}
            matching = self.node_pools.matching_nodes(wanted, annotations.get(CONSUME_ANNOTATION))
            used = self._tpu_nodes_in_use(wanted, exclude=(ns, name))
            if matching - used >= needed:
                continue
            ok = False
            labels = ", ".join(f"{k}={v}" for k, v in wanted.items())
            if matching == 0:
                why = (
                    f"0/{total} nodes are available: {total} node(s) didn't match Pod's node affinity/selector "
                    f"({labels}). preemption: 0/{total} nodes are available: {total} Preemption is not helpful "
                    "for scheduling."
                )
            else:
                why = (
                    f"0/{total} nodes are available: {used} of {matching} matching node(s) already run TPU pods "
                    f"(Insufficient google.com/tpu), {total - matching} node(s) didn't match Pod's node "
                    "affinity/selector."
                )
            for pod in pods:
                if pod["metadata"]["labels"].get("ray.io/group") == group.get("groupName"):
                    self._event(pod, "Warning", "FailedScheduling", why, component="default-scheduler")
        return ok

    def _tpu_nodes_in_use(self, selector: Mapping[str, str], exclude: tuple[str, str]) -> int:
        used = 0
        for pod in self.store.list(PODS, None, "ray.io/node-type=worker"):
            owner = (pod["metadata"]["namespace"], pod["metadata"]["labels"].get("ray.io/cluster"))
            sel = (pod.get("spec") or {}).get("nodeSelector") or {}
            if (
                owner != exclude
                and (pod.get("status") or {}).get("phase") == "Running"
                and all(sel.get(k) == v for k, v in selector.items())
            ):
                used += 1
        return used

    def _container_config_errors(self, pods: list[dict[str, Any]]) -> dict[str, str]:
        """Pod name -> the kubelet's CreateContainerConfigError message, for pods whose env cannot be built.

        The simulated Ray cluster starts as a whole, so it waits until every pod's env resolves.
        """
        errors = {}
        for pod in pods:
            for container in (pod.get("spec") or {}).get("containers") or []:
                try:
                    auth.resolve_env(self.store, pod["metadata"]["namespace"], container.get("env") or [])
                except auth.ContainerConfigError as err:
                    errors[pod["metadata"]["name"]] = str(err)
                    break
        return errors

    def _launch(self, obj: dict[str, Any], state: ClusterState, tpu: SliceShape | None) -> None:
        meta = obj["metadata"]
        head_containers = (((obj.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}).get(
            "spec", {}
        ).get("containers") or [{}]
        head_env = head_containers[0].get("env") or []
        secret = auth.ensure_secret(self.store, obj)
        if secret:
            head_env = auth.with_auth_env(head_env, secret)
        try:
            env = auth.resolve_env(self.store, meta["namespace"], head_env)
        except auth.ContainerConfigError:
            return  # the Secret went away since this pass checked: the next pass reports it on the pod
        spec = LaunchSpec(
            f"{meta['namespace']}-{meta['name']}-{meta['uid'][:8]}", meta["namespace"], meta["name"], tpu, env
        )

        def run() -> None:
            try:
                handle = self.launcher.launch(spec)
            except Exception as err:
                state.error = f"{type(err).__name__}: {err}"
                state.failures += 1
                backoff = min(self.restart_backoff * 2 ** (state.failures - 1), 300.0)
                state.retry_at = time.monotonic() + backoff
            else:
                state.error = None
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

    def _update_pods(
        self,
        obj: dict[str, Any],
        state: ClusterState,
        pods: list[dict[str, Any]],
        schedulable: bool,
        config_errors: Mapping[str, str],
    ) -> None:
        ns = obj["metadata"]["namespace"]
        for pod in pods:
            is_head = pod["metadata"]["labels"].get("ray.io/node-type") == "head"
            running = is_head or schedulable
            config_error = config_errors.get(pod["metadata"]["name"]) if running else None
            ready = config_error is None and (
                (is_head and state.error is None) or (state.visible is not None and running)
            )
            if config_error is not None:
                waiting = {"reason": "CreateContainerConfigError", "message": config_error}
                self._event(pod, "Warning", "Failed", f"Error: {config_error}", component="kubelet")
            elif state.error is not None and is_head:
                waiting = {"reason": "CrashLoopBackOff", "message": f"ray start failed: {state.error}"}
            elif not running:
                waiting = {"reason": "Unschedulable"}
            elif not ready:
                waiting = {"reason": "ContainerCreating"}
            else:
                waiting = None
            restarts = state.failures if is_head else 0
            self._set_pod_status(ns, pod["metadata"]["name"], running, ready, waiting, restarts)
            if is_head and state.error is not None:
                self._event(obj, "Warning", "FailedToStartRayHead", f"ray start failed: {state.error.splitlines()[0]}")
                self.store.set_log(
                    ns,
                    pod["metadata"]["name"],
                    [f"{now_iso()} Starting Ray head (simulated KubeRay stand-in)", *state.error.splitlines()],
                )
        handle = state.visible
        if handle is not None and time.monotonic() - state.last_logs > 1.0:
            state.last_logs = time.monotonic()
            for pod in pods:
                labels = pod["metadata"]["labels"]
                role = (
                    "head"
                    if labels.get("ray.io/node-type") == "head"
                    else f"slice-{labels.get('tpuflow.dev/replica-index', '0')}-w{labels.get('tpuflow.dev/host-index', '0')}"
                )
                with contextlib.suppress(Exception):
                    lines = handle.log_tail(role, 200)
                    if lines:
                        self.store.set_log(ns, pod["metadata"]["name"], lines)

    def _set_pod_status(
        self, ns: str, pod_name: str, running: bool, ready: bool, waiting: dict[str, str] | None, restarts: int = 0
    ) -> None:
        transitions: list[tuple[str, str, str]] = []  # (reason, message, component) events of this change

        def apply(pod: dict[str, Any]) -> None:
            containers = (pod.get("spec") or {}).get("containers") or []
            flag = "True" if ready else "False"
            status = pod.setdefault("status", {})
            if running and status.get("phase") != "Running":
                spec = pod.setdefault("spec", {})
                spec.setdefault("nodeName", _node_name(pod))
                transitions.append(
                    ("Scheduled", f"Successfully assigned {ns}/{pod_name} to {spec['nodeName']}", "default-scheduler")
                )
            was_ready = any(c.get("ready") for c in status.get("containerStatuses") or [])
            if ready and not was_ready:
                for c in containers:
                    transitions.append(("Started", f"Started container {c.get('name', 'ray')}", "kubelet"))
            status["phase"] = "Running" if running else "Pending"
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "True" if running else "False",
                    **({} if running else {"reason": "Unschedulable"}),
                },
                {"type": "Ready", "status": flag},
                {"type": "ContainersReady", "status": flag},
            ]
            if running:
                status["podIP"] = status["hostIP"] = "127.0.0.1"
                status.setdefault("startTime", now_iso())
            status["containerStatuses"] = [
                {
                    "name": c.get("name", "ray"),
                    "image": c.get("image", "unknown"),
                    "imageID": "",
                    "ready": ready,
                    "restartCount": restarts,
                    "started": ready,
                    "state": {"running": {"startedAt": status.get("startTime", now_iso())}}
                    if waiting is None
                    else {"waiting": waiting},
                }
                for c in containers
            ]

        pod = self.store.mutate(PODS, ns, pod_name, apply)
        if pod is not None:
            for reason, message, component in transitions:
                self._event(pod, "Normal", reason, message, component=component)

    def _ensure_headless_service(self, obj: dict[str, Any]) -> None:
        """The webhook's headless Service the TPU worker pods' hostnames resolve under."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        svc_name = headless_service(name)
        if self.store.find(SERVICES, ns, svc_name) is not None:
            return
        self.store.upsert(
            SERVICES,
            ns,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": svc_name,
                    "namespace": ns,
                    "labels": {"ray.io/cluster": name},
                    "ownerReferences": [owner_ref(obj)],
                },
                "spec": {
                    "clusterIP": "None",
                    "type": "ClusterIP",
                    "publishNotReadyAddresses": True,
                    "selector": {"ray.io/cluster": name},
                },
            },
        )

    def _ensure_head_service(self, obj: dict[str, Any], state: ClusterState) -> None:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        ports = self._endpoints(obj, state)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": f"{name}{HEAD_SVC_SUFFIX}",
                "namespace": ns,
                "labels": {"ray.io/cluster": name, "ray.io/node-type": "head"},
                "ownerReferences": [owner_ref(obj)],
            },
            "spec": {
                "type": "ClusterIP",
                "clusterIP": "127.0.0.1",
                "selector": {"ray.io/cluster": name, "ray.io/node-type": "head"},
                "ports": [
                    {"name": n, "port": int(p), "targetPort": int(p), "protocol": "TCP"} for n, p in ports.items()
                ],
            },
        }
        current = self.store.find(SERVICES, ns, body["metadata"]["name"])
        if current is None or current.get("spec") != body["spec"]:
            self.store.upsert(SERVICES, ns, body)
            if current is None:
                self._event(obj, "Normal", "CreatedService", f"Created service {ns}/{body['metadata']['name']}")

    @staticmethod
    def _endpoints(obj: Mapping[str, Any], state: ClusterState) -> dict[str, str]:
        """Port name -> port: the head container's declared ports, replaced by the live local ports."""
        head = (((obj.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec", {})
        containers = head.get("containers") or [{}]
        ports = {
            str(p.get("name")): str(p.get("containerPort")) for p in containers[0].get("ports") or [] if p.get("name")
        }
        handle = state.visible
        if handle is not None:
            live = {
                "dashboard": handle.dashboard_url.rsplit(":", 1)[1],
                "gcs": handle.gcs_address.rsplit(":", 1)[1],
                "serve": str(handle.serve_port),
                **({"metrics": str(handle.metrics_port)} if handle.metrics_port else {}),
            }
            for declared in list(ports):
                if declared in ("gcs-server", "gcs"):
                    ports[declared] = live["gcs"]
                elif declared in live:
                    ports[declared] = live[declared]
                else:
                    ports.pop(declared)  # not simulated locally (client, ...)
            for key, value in live.items():
                ports.setdefault(key, value)
        return ports

    def _update_cluster_status(self, obj: dict[str, Any], state: ClusterState) -> None:
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
        all_ready = head_ready and ready_workers >= desired and state.visible is not None
        if all_ready:
            state.provisioned = True
        stamp = now_iso()
        tpus = sum(int(g.get("replicas", 0) or 0) * int(g.get("numOfHosts", 1) or 1) * tpus_per_host(g) for g in groups)

        def cond(ctype: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
            return {
                "type": ctype,
                "status": "True" if ok else "False",
                "reason": reason,
                "message": message,
                "observedGeneration": obj["metadata"].get("generation", 1),
            }

        head_reason = (
            "HeadPodRunningAndReady"
            if head_ready
            else ("ContainersNotReady" if head is not None else "HeadPodNotFound")
        )
        head_message = "" if head_ready else (state.error or "the head pod is not ready")
        conditions = [
            cond(
                "RayClusterProvisioned",
                state.provisioned,
                "AllPodRunningAndReadyFirstTime" if state.provisioned else "RayClusterPodsProvisioning",
                "" if state.provisioned else "RayCluster Pods are being provisioned for first time",
            ),
            cond("HeadPodReady", head_ready, head_reason, head_message),
        ]
        status: dict[str, Any] = {
            "state": "ready" if all_ready else "",
            "desiredWorkerReplicas": desired,
            "minWorkerReplicas": desired,
            "maxWorkerReplicas": desired,
            "readyWorkerReplicas": ready_workers,
            "availableWorkerReplicas": ready_workers,
            "desiredCPU": desired_resources(obj)["cpu"],
            "desiredMemory": desired_resources(obj)["memory"],
            "desiredGPU": "0",
            "desiredTPU": str(tpus),
            "observedGeneration": obj["metadata"].get("generation", 1),
            "head": {"podName": head["metadata"]["name"] if head else "", "serviceName": f"{name}{HEAD_SVC_SUFFIX}"},
            "conditions": conditions,
        }
        if head_ready:
            status["head"]["podIP"] = "127.0.0.1"
        if state.visible is not None:
            status["head"]["serviceIP"] = "127.0.0.1"
            status["endpoints"] = self._endpoints(obj, state)

        def apply(o: dict[str, Any]) -> None:
            old = o.get("status") or {}
            comparable = {k: v for k, v in old.items() if k not in ("lastUpdateTime", "stateTransitionTimes")}
            stamp_transitions(status["conditions"], old, stamp)
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
