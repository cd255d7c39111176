"""The node agent: GKE's nodes for the real control plane (issue 46). It registers a Node for every node of the
played cluster's node pools (node_registry), runs each Pod the real scheduler binds to them as local processes
in the pod's own network namespace (pod_runner), reports their status, makes Service addresses and cluster names
work (service_proxy, network), and serves GKE's TPU webhook (tpu_webhook).

    agent = NodeAgent(api, workdir, pools=lambda: gke_pool_states(), cluster="projects/P/locations/Z/clusters/C")
    agent.start(); ...; agent.stop()   # stop: every pod's processes, the nodes, the network

One loop (``interval`` seconds) does what a kubelet's sync loop and kube-proxy do: pods bound here start, pods
being deleted get their grace period and then the kubelet's final delete, statuses that changed are patched,
Services and EndpointSlices are mirrored. Node heartbeats every 10 s.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tpuflow_rehearsal.nodes import network as net
from tpuflow_rehearsal.nodes.kube_rest import KubeError, KubeRest
from tpuflow_rehearsal.nodes.node_registry import NodeRegistry, NodeSpec, wanted_nodes
from tpuflow_rehearsal.nodes.pod_env import api_lookup, tpu_metadata
from tpuflow_rehearsal.nodes.pod_runner import PodRun, RunContext
from tpuflow_rehearsal.nodes.service_proxy import ServiceProxy

HEARTBEAT_S = 10.0
IMAGE_TOOLS = ("ray", "serve", "python", "python3", "pip")


def image_bin(folder: Path) -> Path:
    """The "image's" /usr/local/bin: shims that run this environment's ``ray``, ``python``, ... ."""
    folder.mkdir(parents=True, exist_ok=True)
    venv = Path(sys.executable).parent
    for tool in IMAGE_TOOLS:
        target = venv / tool if (venv / tool).exists() else Path(sys.executable)
        shim = folder / tool
        shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        shim.chmod(0o755)
    return folder


class NodeAgent:
    def __init__(
        self,
        api: KubeRest,
        workdir: str | Path,
        *,
        cluster: str,
        pools: Callable[[], Iterable[Mapping[str, Any]]],
        index: int | None = None,
        host_ports: Iterable[int] = (),
        extra_env: Mapping[str, str] | None = None,
        interval: float = 0.5,
        log: Callable[[str], None] | None = None,
    ) -> None:
        reason = net.available()
        if reason:
            raise net.NetworkError(reason)
        self.api, self.workdir, self.cluster, self.pools = api, Path(workdir), cluster, pools
        self.index = net.claim_index() if index is None else index
        self.network = net.PodNetwork(self.index).up()
        self.proxy = ServiceProxy(self.network.bridge)
        self.registry = NodeRegistry(api, self.index, self.network.gateway)
        self.interval = interval
        self.log = log or (lambda line: print(f"node-agent: {line}", file=sys.stderr, flush=True))
        self.runs: dict[str, PodRun] = {}  # pod uid -> run
        self.pods_started: list[str] = []  # every pod this agent ran, "<namespace>/<name>"
        self._reported: dict[str, str] = {}  # pod uid -> last status sent (JSON)
        self._deleting: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_heartbeat = 0.0
        self._names: dict[str, set[str]] = {}  # address -> cluster names (Services, pods under headless ones)
        self.host_ports = list(host_ports)
        # what the "image" sets: nothing of this process's environment reaches a pod (its secrets least of all)
        env = {
            "PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "JAX_PLATFORMS": "cpu",  # the simulated TPU hosts compute on CPU
            "RAY_USAGE_STATS_ENABLED": "0",
            **dict(extra_env or {}),
        }
        self.base_env = self._rewrite_host_ports(env)
        self.ctx = RunContext(
            network=self.network,
            workdir=self.workdir,
            image_bin=image_bin(self.workdir / "image-bin"),
            base_env=self.base_env,
            node_env=self._node_env,
            host_address=lambda _node: self.network.gateway,
            lookup=lambda namespace: api_lookup(self.api, namespace),
            write_hosts=lambda uid, host, ip: self.network.write_hosts(uid, host, ip, self._names),
            log=self.log,
        )

    # --- what pods see of the host -------------------------------------------------------------------------
    def _rewrite_host_ports(self, env: dict[str, str]) -> dict[str, str]:
        """Host services on loopback (the GCS emulator, its GCE metadata stand-in, ...) as pods reach them: the pod
        network's gateway."""
        for port in self.host_ports:
            address = self.network.forward_host_port(port)
            for key, value in list(env.items()):
                for host in ("127.0.0.1", "localhost"):
                    value = value.replace(f"{host}:{port}", address)
                env[key] = value
        return env

    def _node_env(self, node: str) -> Mapping[str, str]:
        spec = self.registry.known.get(node)
        return tpu_metadata(spec.labels) if spec else {}

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        self.sync_nodes()
        self._thread = threading.Thread(target=self._loop, name="node-agent", daemon=True)
        self._thread.start()
        return self

    def stop(self, grace: float = 5.0) -> None:
        self._halt(grace, pre_stop=True)
        with contextlib.suppress(Exception):
            self.registry.remove_all()
        self.network.down()

    def crash(self) -> None:
        """The nodes die at once (the fault matrix's "node agent killed"): the loop stops, every pod's processes
        are SIGKILLed with no preStop hook and their sandboxes go, and the API hears nothing: the Nodes stay, their
        heartbeats stop and each pod keeps the status last reported. A NodeAgent started again on the same
        ``index`` is the nodes coming back (``PodRun.after_node_restart``)."""
        self._halt(0.0, pre_stop=False)
        self.network.release()

    def _halt(self, grace: float, *, pre_stop: bool) -> None:
        """Stop the loop, then every pod's processes at once (each within ``grace``), and the Service proxy."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        threads = [
            threading.Thread(target=run.terminate, args=(grace,), kwargs={"pre_stop": pre_stop})
            for run in self.runs.values()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.runs.clear()
        self.proxy.stop()

    def _loop(self) -> None:
        failing: str | None = None  # the outage being retried: said once when it starts and once when it ends
        while not self._stop.wait(self.interval):
            try:
                self.sync_once()
            except (KubeError, OSError) as err:  # the API restarting: the next round retries, as a kubelet does
                if failing is None:
                    self.log(f"sync: {err}; retrying every {self.interval:g} s")
                failing = str(err)
                continue
            if failing is not None:
                self.log("sync: the API answers again")
                failing = None

    # --- one round -----------------------------------------------------------------------------------------
    def sync_nodes(self) -> None:
        added, removed = self.registry.sync(self._wanted())
        for name in added:
            self.log(f"registered node {name}")
        for name in removed:
            self.log(f"removed node {name} (its pool is gone)")

    def _wanted(self) -> list[NodeSpec]:
        return wanted_nodes(self.cluster, self.pools())

    def sync_once(self) -> None:
        self.sync_nodes()
        if time.monotonic() - self._last_heartbeat >= HEARTBEAT_S:
            self.registry.heartbeat()
            self._last_heartbeat = time.monotonic()
        pods = [
            p for p in self.api.items("/api/v1/pods") if (p.get("spec") or {}).get("nodeName") in self.registry.known
        ]
        present = {p["metadata"]["uid"] for p in pods}
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if pod["metadata"].get("deletionTimestamp"):
                self._delete(pod)
            elif uid not in self.runs and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                run = PodRun(pod, self.ctx)
                if (pod.get("status") or {}).get("containerStatuses"):  # it ran here before the nodes died
                    run.after_node_restart(pod["status"])
                self.runs[uid] = run
                self.log(f"starting pod {run.namespace}/{run.name} on {run.node}")
                self.pods_started.append(f"{run.namespace}/{run.name}")
                run.start()
        for uid in [u for u in self.runs if u not in present]:  # force-deleted, or its node went away
            run = self.runs.pop(uid)
            threading.Thread(target=run.terminate, args=(0.0,), daemon=True).start()
            self._reported.pop(uid, None)
        for uid, run in list(self.runs.items()):
            if uid in self._deleting:
                continue
            status = run.status()
            text = json.dumps(status, sort_keys=True)
            if self._reported.get(uid) != text:
                try:
                    self.api.merge_patch(
                        f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status", {"status": status}
                    )
                    self._reported[uid] = text
                except KubeError as err:
                    if err.status != 404:
                        raise
        self._sync_services(pods)

    def _delete(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if uid in self._deleting:
            return
        self._deleting.add(uid)
        run = self.runs.get(uid)
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)

        def finish() -> None:
            if run is not None:
                run.terminate(grace)
            with contextlib.suppress(KubeError):  # the kubelet's final delete once the containers are gone
                self.api.request(
                    "DELETE",
                    f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}",
                    {
                        "apiVersion": "v1",
                        "kind": "DeleteOptions",
                        "gracePeriodSeconds": 0,
                        "preconditions": {"uid": uid},
                    },
                )
            self.runs.pop(uid, None)
            self._reported.pop(uid, None)
            self._deleting.discard(uid)

        threading.Thread(target=finish, name=f"delete-{meta['name']}", daemon=True).start()

    def _sync_services(self, pods: list[dict[str, Any]]) -> None:
        services = self.api.items("/api/v1/services")
        slices = self.api.items("/apis/discovery.k8s.io/v1/endpointslices")
        self.proxy.sync(services, slices)
        names: dict[str, set[str]] = {}
        for service in services:
            meta, spec = service["metadata"], service.get("spec") or {}
            ns, svc = meta.get("namespace", "default"), meta["name"]
            aliases = {svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.{net.CLUSTER_DOMAIN}"}
            if spec.get("clusterIP") and spec["clusterIP"] != "None":
                names.setdefault(spec["clusterIP"], set()).update(aliases)
                continue
            for piece in slices:  # headless: the name resolves to its endpoints' pods
                if (piece["metadata"].get("labels") or {}).get("kubernetes.io/service-name") != svc:
                    continue
                for ep in piece.get("endpoints") or []:
                    for address in ep.get("addresses") or []:
                        names.setdefault(address, set()).update(aliases)
        for pod in pods:
            spec, status = pod.get("spec") or {}, pod.get("status") or {}
            ip = status.get("podIP")
            if ip and spec.get("hostname") and spec.get("subdomain"):
                ns = pod["metadata"].get("namespace", "default")
                base = f"{spec['hostname']}.{spec['subdomain']}"
                names.setdefault(ip, set()).update(
                    {base, f"{base}.{ns}", f"{base}.{ns}.svc", f"{base}.{ns}.svc.{net.CLUSTER_DOMAIN}"}
                )
        self._names = names
        for uid, run in list(self.runs.items()):
            if run.iface is not None and not run.terminating:
                host = run.hostname
                self.network.write_hosts(uid, host, run.iface.ip, names)
