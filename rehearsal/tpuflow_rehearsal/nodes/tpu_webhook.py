"""GKE's KubeRay TPU webhook (the Ray Operator add-on's), served over HTTPS for the real kube-apiserver to call.

Played from the behaviour of the add-on's webhook (github.com/ai-on-gke/kuberay-tpu-webhook, main.go), not from
the operators' pre-flight check:

- ``/validate`` (RayCluster CREATE): every worker group whose containers request ``google.com/tpu`` must have
  ``numOfHosts`` = max(chips of its ``cloud.google.com/gke-tpu-topology`` node selector / chips per pod, 1), or the
  request is denied with "Number of workers in worker group not equal to specified topology". A TPU group without a
  topology selector, without chips or with numOfHosts 0 fails the call (HTTP 403), as the add-on's does.
- ``/mutate`` (Pod CREATE, pods labelled ``app.kubernetes.io/name: kuberay``): a TPU worker pod gets its slice
  (replica) and host index — from KubeRay's ``ray.io/worker-group-replica-index`` / ``ray.io/replica-host-index``
  labels when both are there, else the lowest free ones among the group's live pods (label ``replicaIndex``) —
  and ``TPU_WORKER_ID``, ``TPU_NAME``, ``TPU_DEVICE_PLUGIN_HOST_IP``/``ADDR``, and on multi-host slices
  ``TPU_WORKER_HOSTNAMES``, hostname ``<group>-<replica>-<host>`` under subdomain ``<cluster>-headless`` (the Service KubeRay makes for multi-host groups),
  and pod (anti-)affinity on ``cloud.google.com/gke-nodepool`` that keeps one slice's pods on one node pool.
  Also ``TORCH_TPU_TOPOLOGY`` / ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (the add-on's newer releases) and, for
  Ironwood, ``TPU_PROCESS_ADDRESSES`` / ``TPU_PROCESS_PORT``; ``MEGASCALE_*`` when ``MEGASCALE_NUM_SLICES`` is set.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TPU = "google.com/tpu"
TOPOLOGY = "cloud.google.com/gke-tpu-topology"
ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
NODEPOOL = "cloud.google.com/gke-nodepool"
REPLICA_LABEL = "replicaIndex"
KUBERAY_REPLICA_INDEX = "ray.io/worker-group-replica-index"
KUBERAY_HOST_INDEX = "ray.io/replica-host-index"
KUBERAY_REPLICA_NAME = "ray.io/worker-group-replica-name"
DENIAL = "Number of workers in worker group not equal to specified topology"
HEADLESS_SUFFIX = "headless"  # KubeRay's utils.HeadlessServiceSuffix (v1.6.0), which the add-on imports
PROCESS_PORT = 8471
MEGASCALE_PORT = 8081
MUTATING_NAME = "kuberay-tpu-mutating-webhook-cfg"
VALIDATING_NAME = "kuberay-tpu-validating-webhook-cfg"

PodLister = Callable[[str, str, str], list[dict[str, Any]]]  # (namespace, cluster, group) -> pods


class WebhookFailure(Exception):
    """The add-on answers HTTP 403 with a plain line, so the API server reports the call failed."""


def _chips(resources: Mapping[str, Any] | None) -> int:
    try:
        return int(str((resources or {}).get(TPU, 0)))
    except ValueError:
        return 0


def container_chips(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    return _chips(resources.get("requests")) or _chips(resources.get("limits"))


def chips_per_pod(pod_spec: Mapping[str, Any]) -> int:
    return sum(container_chips(c) for c in pod_spec.get("containers") or [])


def topology_chips(topology: str) -> int:
    return math.prod(int(d) for d in topology.lower().split("x"))


def expected_hosts(pod_spec: Mapping[str, Any]) -> int:
    topology = (pod_spec.get("nodeSelector") or {}).get(TOPOLOGY)
    if not topology:
        raise WebhookFailure("TPU topology not specified")
    chips = chips_per_pod(pod_spec)
    if chips == 0:
        raise WebhookFailure("Container does not set TPU limits")
    return max(topology_chips(topology) // chips, 1)


def headless_service(cluster: str) -> str:
    name = f"{cluster}-{HEADLESS_SUFFIX}"
    return name if len(name) <= 63 else name[len(name) - 63 :]  # KubeRay's CheckName keeps the tail


def validate_raycluster(cluster: Mapping[str, Any]) -> str | None:
    """None when admitted, else the denial message."""
    for group in (cluster.get("spec") or {}).get("workerGroupSpecs") or []:
        pod_spec = (group.get("template") or {}).get("spec") or {}
        if not any(container_chips(c) for c in pod_spec.get("containers") or []):
            continue
        hosts = int(group.get("numOfHosts") or 0)
        if hosts == 0:
            raise WebhookFailure("workerGroupSpec NumOfHosts not set")
        if expected_hosts(pod_spec) != hosts:
            return DENIAL
    return None


def _indices(pod: Mapping[str, Any], hosts: int, lister: PodLister) -> tuple[int, int, bool]:
    """(replica, host, legacy) of a new TPU pod."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if KUBERAY_REPLICA_INDEX in labels and KUBERAY_HOST_INDEX in labels:
        return int(labels[KUBERAY_REPLICA_INDEX]), int(labels[KUBERAY_HOST_INDEX]), False
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    taken: dict[int, set[int]] = {}
    for other in lister(namespace, labels["ray.io/cluster"], labels["ray.io/group"]):
        meta = other.get("metadata") or {}
        if meta.get("deletionTimestamp") or REPLICA_LABEL not in (meta.get("labels") or {}):
            continue
        replica = int(str(meta["labels"][REPLICA_LABEL]).rsplit("-", 1)[-1])
        for container in (other.get("spec") or {}).get("containers") or []:
            for env in container.get("env") or []:
                if env.get("name") == "TPU_WORKER_ID" and str(env.get("value", "")).isdigit():
                    taken.setdefault(replica, set()).add(int(env["value"]))
    replica = next((r for r in range(len(taken) + 1) if len(taken.get(r, ())) < hosts), len(taken))
    host = next(h for h in range(hosts + 1) if h not in taken.get(replica, set()))
    return replica, host, True


def _affinity(cluster: str, replica_key: str, replica_value: str) -> dict[str, Any]:
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": replica_key, "operator": "In", "values": [replica_value]},
                            {"key": "ray.io/cluster", "operator": "In", "values": [cluster]},
                        ]
                    },
                    "topologyKey": NODEPOOL,
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": replica_key, "operator": "NotIn", "values": [replica_value]},
                            {"key": "ray.io/cluster", "operator": "In", "values": [cluster]},
                        ]
                    },
                    "topologyKey": NODEPOOL,
                },
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": replica_key, "operator": "Exists"},
                            {"key": "ray.io/cluster", "operator": "NotIn", "values": [cluster]},
                        ]
                    },
                    "namespaceSelector": {
                        "matchExpressions": [
                            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
                        ]
                    },
                    "topologyKey": NODEPOOL,
                },
            ]
        },
    }


def mutate_pod(pod: Mapping[str, Any], lister: PodLister) -> list[dict[str, Any]]:
    """The JSON patch for a new pod (empty: not a TPU pod)."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    tpu_containers = [i for i, c in enumerate(containers) if container_chips(c)]
    if not tpu_containers:
        return []
    labels = (pod.get("metadata") or {}).get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    if "ray.io/cluster" not in labels or "ray.io/group" not in labels or TOPOLOGY not in selector:
        raise WebhookFailure("Kuberay Pod missing RayCluster label, group label or TPU topology")
    cluster, group = labels["ray.io/cluster"], labels["ray.io/group"]
    hosts = expected_hosts(spec)
    replica, host, legacy = _indices(pod, hosts, lister)
    v7x = str(selector.get(ACCELERATOR, "")).startswith("tpu7x")
    patch: list[dict[str, Any]] = []
    if legacy:
        patch.append({"op": "add", "path": f"/metadata/labels/{REPLICA_LABEL}", "value": f"{group}-{replica}"})
    domain = headless_service(cluster)
    hostnames = [f"{group}-{replica}-{h}.{domain}" for h in range(hosts)]
    if hosts > 1:
        patch.append({"op": "add", "path": "/spec/hostname", "value": f"{group}-{replica}-{host}"})
        patch.append({"op": "add", "path": "/spec/subdomain", "value": domain})
        key, value = (
            (KUBERAY_REPLICA_NAME, labels[KUBERAY_REPLICA_NAME])
            if KUBERAY_REPLICA_NAME in labels
            else (REPLICA_LABEL, f"{group}-{replica}")
        )
        patch.append({"op": "add", "path": "/spec/affinity", "value": _affinity(cluster, key, value)})
    dims = str(selector[TOPOLOGY]).lower().split("x")
    torch_topology = [*dims, *["1"] * (3 - len(dims))] + (["2"] if v7x else [])
    per_host = chips_per_pod(spec) * (2 if v7x else 1)
    slicebuilder = [
        f"{h}:{PROCESS_PORT + d}" for h in (hostnames if hosts > 1 else ["localhost"]) for d in range(per_host)
    ]
    for position, index in enumerate(tpu_containers):
        container = containers[index]
        existing = {e.get("name"): e for e in container.get("env") or []}
        worker_id = host * len(tpu_containers) + position if v7x else host
        wanted: list[dict[str, Any]] = []
        if hosts > 1 and existing.get("TPU_WORKER_HOSTNAMES", {}).get("value") in (None, "localhost"):
            wanted.append({"name": "TPU_WORKER_HOSTNAMES", "value": ",".join(hostnames)})
        values = {
            "TPU_WORKER_ID": str(worker_id),
            "TPU_NAME": f"{group}-{replica}",
            "TPU_DEVICE_PLUGIN_ADDR": "$(TPU_DEVICE_PLUGIN_HOST_IP):2112",
            "TORCH_TPU_TOPOLOGY": ",".join(torch_topology),
            "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(slicebuilder),
        }
        if v7x and hosts > 1:
            values["TPU_PROCESS_ADDRESSES"] = ",".join(
                f"{h}:{PROCESS_PORT + c}" for h in hostnames for c in range(len(tpu_containers))
            )
            values["TPU_PROCESS_PORT"] = str(PROCESS_PORT + position)
        if "MEGASCALE_NUM_SLICES" in existing:
            values["MEGASCALE_SLICE_ID"] = str(replica)
            values["MEGASCALE_COORDINATOR_ADDRESS"] = f"{group}-0-0.{domain}" + (f":{MEGASCALE_PORT}" if v7x else "")
            values["MEGASCALE_PORT"] = str(MEGASCALE_PORT + (position if v7x else 0))
        if "TPU_DEVICE_PLUGIN_HOST_IP" not in existing:
            wanted.append(
                {"name": "TPU_DEVICE_PLUGIN_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
            )
        wanted += [{"name": k, "value": v} for k, v in values.items() if k not in existing]
        if "TORCH_TPU_TOPOLOGY" in existing:
            wanted = [e for e in wanted if e["name"] != "TORCH_TPU_SLICEBUILDER_ADDRESSES"]
        if not container.get("env"):
            patch.append({"op": "add", "path": f"/spec/containers/{index}/env", "value": wanted})
        else:
            patch += [{"op": "add", "path": f"/spec/containers/{index}/env/-", "value": e} for e in wanted]
    return patch


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        return

    def do_POST(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        request = review.get("request") or {}
        obj = request.get("object") or {}
        response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
        try:
            if self.path.startswith("/validate"):
                if obj.get("kind") != "RayCluster":
                    raise WebhookFailure("Invalid Kind")
                denial = validate_raycluster(obj)
                if denial:
                    response.update(allowed=False, status={"status": "Failure", "message": denial, "code": 400})
            elif self.path.startswith("/mutate"):
                if obj.get("kind") != "Pod":
                    raise WebhookFailure("Invalid Kind")
                obj.setdefault("metadata", {}).setdefault("namespace", request.get("namespace") or "default")
                patch = mutate_pod(obj, self.server.lister)
                if patch:
                    response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode())
            else:
                self.send_error(404)
                return
        except (WebhookFailure, ValueError, KeyError) as err:
            body = f"Failed to admit {obj.get('kind', 'object')}: {err}".encode()
            self.send_response(403)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    lister: PodLister


class TpuWebhookServer:
    """``TpuWebhookServer(cert_pem, key_pem, lister).start()``; ``configurations(ca_pem)`` are what to apply."""

    def __init__(self, cert_pem: bytes, key_pem: bytes, lister: PodLister, host: str = "127.0.0.1") -> None:
        self._server = _Server((host, 0), _Handler)
        self._server.lister = lister
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory(prefix="tpuflow-webhook-") as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_bytes(cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(key_pem)
            context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        if isinstance(host, (bytes, bytearray)):  # typeshed allows bytes; getsockname() gives an AF_INET host as str
            host = host.decode()
        return f"https://{host}:{port}"

    def start(self) -> TpuWebhookServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="tpu-webhook", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        with contextlib.suppress(OSError):
            self._server.server_close()

    def configurations(self, ca_pem: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        """The add-on's MutatingWebhookConfiguration and ValidatingWebhookConfiguration, pointing here."""
        ca = base64.b64encode(ca_pem).decode()
        namespaces = {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", "kube-node-lease"],
                }
            ]
        }
        mutating = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": MUTATING_NAME},
            "webhooks": [
                {
                    "name": "kuberay-tpu-webhook.ray-system.svc",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "NoneOnDryRun",
                    "clientConfig": {"url": f"{self.url}/mutate", "caBundle": ca},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                    "objectSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay"}},
                    "namespaceSelector": namespaces,
                }
            ],
        }
        validating = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": VALIDATING_NAME},
            "webhooks": [
                {
                    "name": "raycluster-kuberay-tpu-webhook.ray-system.svc",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "NoneOnDryRun",
                    "clientConfig": {"url": f"{self.url}/validate", "caBundle": ca},
                    "rules": [
                        {
                            "apiGroups": ["ray.io"],
                            "apiVersions": ["*"],
                            "operations": ["CREATE"],
                            "resources": ["rayclusters"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": namespaces,
                }
            ],
        }
        return mutating, validating
