"""The real Kubernetes control plane of the GKE rehearsal: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the KubeRay operator, each a child process on loopback ports, stopped by PID.

    with ControlPlane(workdir) as plane:
        plane.kubeconfig("admin")   # what kubectl and the Airflow connection use

What is real and how it is set up:
- etcd (``tpuflow-kube etcd``: etcd's own command from go.etcd.io/etcd/server/v3) with one member, no fsync;
- kube-apiserver: HTTPS with a throw-away CA, static bearer tokens for its clients (--token-auth-file), RBAC,
  the default admission chain (MutatingAdmissionWebhook and ValidatingAdmissionWebhook included), a
  service-account signing key; the ``kubernetes`` Service gets no endpoints (--endpoint-reconciler-type=none:
  its address would be loopback, which Endpoints reject, and no pod here talks to the API);
- kube-controller-manager with every default controller (garbage collection of owned objects, namespaces,
  endpoints, service accounts and their tokens, node lifecycle), each under its own service account;
- kube-scheduler: binds pods to the nodes the node agent registers (node selectors, taints, google.com/tpu);
- the KubeRay operator with its own ClusterRole (config/rbac/role.yaml of its module) bound to its user, the
  CRDs of the same module version, and --use-kubernetes-proxy: it reaches Ray dashboards through the API
  server's service proxy, as it would from outside the cluster network.

Identities (static tokens): ``admin`` (group system:masters: kubectl, Airflow), ``system:kube-controller-manager`` and
``system:kube-scheduler`` (the bootstrap RBAC roles of those names), ``kuberay-operator``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tpuflow_rehearsal.controlplane import binaries as binaries_mod
from tpuflow_rehearsal.controlplane import pki
from tpuflow_rehearsal.supervise import spawn

STATE_FILE = "controlplane.json"
SERVICE_CIDR = "10.96.0.0/16"  # GKE's default range for Services
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0
# GKE's cloud node lifecycle (a VM that is gone takes its Node with it): what the node agent needs beyond the
# built-in system:node and system:node-proxier roles
CLOUD_NODE_LIFECYCLE_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "tpuflow:cloud-node-lifecycle"},
    "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "delete"]}],
}
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kuberay-operator")


class ControlPlaneError(RuntimeError):
    """A component did not start (the line names it and its log)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = spawn(  # a restart may come from any thread (tpuflow_rehearsal.supervise.spawn)
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = STOP_GRACE_S, sig: int = signal.SIGTERM) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def last_lines(self, n: int = 3) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-n:])


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + the KubeRay operator (module docstring)."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        bins: binaries_mod.Binaries | None = None,
        service_cidr: str = SERVICE_CIDR,
        node_monitor_grace_s: int = 20,
        kuberay_feature_gates: str = "",
        extra_users: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        """``extra_users``: more static-token identities, each with the ClusterRoles bound to it."""
        self.workdir = Path(workdir).resolve()
        self.bins = bins
        self.service_cidr = service_cidr
        self.node_monitor_grace_s = node_monitor_grace_s
        self.kuberay_feature_gates = kuberay_feature_gates
        self.extra_users = dict(extra_users or {})
        self.ports: dict[str, int] = {}
        self.clients: dict[str, pki.Client] = {}
        self.paths: dict[str, Path] = {}
        self.components: dict[str, Component] = {}

    # --- addresses and identities ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd']}"

    def kubeconfig(self, user: str = "admin") -> Path:
        return self.workdir / "kubeconfigs" / f"{user.replace(':', '-')}.kubeconfig"

    def token(self, user: str = "admin") -> str:
        return self.clients[user].token

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.paths["ca_cert"]))

    # --- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        self.bins = self.bins or binaries_mod.ensure()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ports = {
            "etcd": free_port(),
            "etcd_peer": free_port(),
            "apiserver": free_port(),
            "controller_manager": free_port(),
            "scheduler": free_port(),
            "kuberay_metrics": free_port(),
            "kuberay_probe": free_port(),
        }
        self.clients = {
            "admin": pki.new_client("admin", "system:masters"),  # the bootstrap identity, as kubeadm's super-admin
            "system:kube-controller-manager": pki.new_client("system:kube-controller-manager"),
            "system:kube-scheduler": pki.new_client("system:kube-scheduler"),
            "kuberay-operator": pki.new_client("kuberay-operator"),
            **{user: pki.new_client(user) for user in self.extra_users},
        }
        first_service_ip = self._first_service_ip()
        self.paths = pki.write_pki(
            self.workdir / "pki",
            list(self.clients.values()),
            api_hosts=[
                "localhost",
                "127.0.0.1",
                first_service_ip,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        for user in self.clients:
            self._write_kubeconfig(user)
        self.components = self._components()
        try:
            self._start_component("etcd", self._etcd_ready)
            self._start_component("kube-apiserver", self._apiserver_ready)
            self._bootstrap()
            self._start_component("kube-controller-manager", self._controller_manager_ready)
            self._start_component("kube-scheduler", None)
            self._start_component("kuberay-operator", self._kuberay_ready)
        except BaseException:
            self.stop()
            raise
        self.write_state()
        return self

    def stop(self) -> None:
        for name in reversed(COMPONENTS):
            component = self.components.get(name)
            if component is not None:
                component.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / STATE_FILE).unlink()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self, name: str) -> None:
        """SIGKILL one component (the fault matrix's "killed mid-reconcile")."""
        self.components[name].stop(grace=0.0, sig=signal.SIGKILL)

    def restart(self, name: str, *, kill: bool = False) -> None:
        """Stop one component (SIGKILL if ``kill``) and start it again on the same ports and data."""
        component = self.components[name]
        component.stop(grace=0.0 if kill else STOP_GRACE_S, sig=signal.SIGKILL if kill else signal.SIGTERM)
        ready = {
            "etcd": self._etcd_ready,
            "kube-apiserver": self._apiserver_ready,
            "kube-controller-manager": self._controller_manager_ready,
            "kuberay-operator": self._kuberay_ready,
        }.get(name)
        self._start_component(name, ready)
        self.write_state()

    def state(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "etcd_url": self.etcd_url,
            "ports": self.ports,
            "pids": {name: c.pid for name, c in self.components.items() if c.alive()},
            "kubeconfig": str(self.kubeconfig("admin")),
            "ca_cert": str(self.paths["ca_cert"]),
            "service_cidr": self.service_cidr,
            "logs": {name: str(c.log) for name, c in self.components.items()},
        }

    def write_state(self) -> None:
        tmp = self.workdir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.state(), indent=2))
        tmp.replace(self.workdir / STATE_FILE)

    # --- components -----------------------------------------------------------------------------------
    def _first_service_ip(self) -> str:
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    def _components(self) -> dict[str, Component]:
        assert self.bins is not None
        kube, logs, p = str(self.bins.kube), self.workdir / "logs", self.paths
        etcd_peer = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        return {
            "etcd": Component(
                "etcd",
                [
                    kube,
                    "etcd",
                    "--name=tpuflow",
                    f"--data-dir={self.workdir / 'etcd'}",
                    f"--listen-client-urls={self.etcd_url}",
                    f"--advertise-client-urls={self.etcd_url}",
                    f"--listen-peer-urls={etcd_peer}",
                    f"--initial-advertise-peer-urls={etcd_peer}",
                    f"--initial-cluster=tpuflow={etcd_peer}",
                    "--unsafe-no-fsync",  # a rehearsal's data need not survive a power cut
                    "--log-level=warn",
                ],
                logs / "etcd.log",
            ),
            "kube-apiserver": Component(
                "kube-apiserver",
                [
                    kube,
                    "kube-apiserver",
                    f"--etcd-servers={self.etcd_url}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={self.ports['apiserver']}",
                    f"--cert-dir={self.workdir / 'apiserver-certs'}",
                    f"--tls-cert-file={p['apiserver_cert']}",
                    f"--tls-private-key-file={p['apiserver_key']}",
                    f"--token-auth-file={p['tokens']}",
                    "--authorization-mode=RBAC",
                    "--anonymous-auth=false",
                    f"--service-account-key-file={p['sa_pub']}",
                    f"--service-account-signing-key-file={p['sa_key']}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-cluster-ip-range={self.service_cidr}",
                    "--endpoint-reconciler-type=none",
                    "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,"
                    "ExtendedResourceToleration,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota",
                    "--allow-privileged=true",
                    "--profiling=false",
                ],
                logs / "kube-apiserver.log",
            ),
            "kube-controller-manager": Component(
                "kube-controller-manager",
                [
                    kube,
                    "kube-controller-manager",
                    f"--kubeconfig={self.kubeconfig('system:kube-controller-manager')}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.ports['controller_manager']}",
                    "--leader-elect=false",
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={p['sa_key']}",
                    f"--root-ca-file={p['ca_cert']}",
                    f"--service-cluster-ip-range={self.service_cidr}",
                    f"--node-monitor-grace-period={self.node_monitor_grace_s}s",
                    "--profiling=false",
                ],
                logs / "kube-controller-manager.log",
            ),
            "kube-scheduler": Component(
                "kube-scheduler",
                [
                    kube,
                    "kube-scheduler",
                    f"--kubeconfig={self.kubeconfig('system:kube-scheduler')}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.ports['scheduler']}",
                    "--leader-elect=false",
                    "--profiling=false",
                ],
                logs / "kube-scheduler.log",
            ),
            "kuberay-operator": Component(
                "kuberay-operator",
                [
                    str(self.bins.kuberay),
                    f"--metrics-addr=127.0.0.1:{self.ports['kuberay_metrics']}",
                    f"--health-probe-bind-address=127.0.0.1:{self.ports['kuberay_probe']}",
                    "--enable-leader-election=false",
                    "--use-kubernetes-proxy",
                    "--log-stdout-encoder=console",
                    *([f"--feature-gates={self.kuberay_feature_gates}"] if self.kuberay_feature_gates else []),
                ],
                logs / "kuberay-operator.log",
                env={"KUBECONFIG": str(self.kubeconfig("kuberay-operator"))},
            ),
        }

    def _start_component(self, name: str, ready: Any) -> None:
        component = self.components[name]
        component.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if not component.alive():
                raise ControlPlaneError(f"{name} exited at start (see {component.log}): {component.last_lines()}")
            if ready is None or ready():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{name} not ready after {START_TIMEOUT_S:.0f}s (see {component.log})")
            time.sleep(0.2)

    def _get(self, url: str, *, token: str | None = None, context: ssl.SSLContext | None = None) -> bool:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=3, context=context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _etcd_ready(self) -> bool:
        return self._get(f"{self.etcd_url}/health")

    def _apiserver_ready(self) -> bool:
        return self._get(f"{self.url}/readyz", token=self.token(), context=self.ssl_context())

    def _controller_manager_ready(self) -> bool:
        """Its service-account controller has made the default namespace's ``default`` ServiceAccount: until then the
        API server's ServiceAccount admission refuses every pod there (KubeRay's FailedCreateHeadPod, "serviceaccount
        "default" not found"), which a run started right after the plane came up met."""
        return self._get(
            f"{self.url}/api/v1/namespaces/default/serviceaccounts/default",
            token=self.token(),
            context=self.ssl_context(),
        )

    def _kuberay_ready(self) -> bool:
        return self._get(f"http://127.0.0.1:{self.ports['kuberay_probe']}/readyz")

    # --- kubeconfigs and bootstrap objects ------------------------------------------------------------
    def _write_kubeconfig(self, user: str, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tpuflow",
                    "cluster": {"server": self.url, "certificate-authority": str(self.paths["ca_cert"])},
                }
            ],
            "users": [{"name": user, "user": {"token": self.token(user)}}],
            "contexts": [{"name": "tpuflow", "context": {"cluster": "tpuflow", "user": user, "namespace": namespace}}],
            "current-context": "tpuflow",
        }
        path = self.kubeconfig(user)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def api(self) -> Any:
        """A kubernetes ApiClient as admin."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig("admin")))

    def _bootstrap(self) -> None:
        """Who may do what (KubeRay's own role for its operator, the extra users' roles) and KubeRay's CRDs."""
        from kubernetes import client

        assert self.bins is not None
        api = self.api()
        rbac = client.RbacAuthorizationV1Api(api)
        role = yaml.safe_load(self.bins.operator_role.read_text())
        rbac.create_cluster_role(role)
        rbac.create_cluster_role(CLOUD_NODE_LIFECYCLE_ROLE)
        bindings = [("kuberay-operator", role["metadata"]["name"], "kuberay-operator")]
        for user, roles in self.extra_users.items():
            bindings += [(f"tpuflow-{user.replace(':', '-')}-{r.replace(':', '-')}", r, user) for r in roles]
        for name, role_name, user in bindings:
            rbac.create_cluster_role_binding(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
                }
            )
        extensions = client.ApiextensionsV1Api(api)
        names = []
        for path in sorted(self.bins.crds.glob("ray.io_*.yaml")):
            crd = yaml.safe_load(path.read_text())
            extensions.create_custom_resource_definition(crd)
            names.append(crd["metadata"]["name"])
        deadline = time.monotonic() + 60
        while names:
            crd = extensions.read_custom_resource_definition(names[0])
            if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
                names.pop(0)
            elif time.monotonic() > deadline:
                raise ControlPlaneError(f"KubeRay's CRD {names[0]} not established after 60s")
            else:
                time.sleep(0.2)


def read_state(workdir: str | Path) -> Mapping[str, Any] | None:
    path = Path(workdir) / STATE_FILE
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
