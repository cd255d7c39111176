"""RayCluster and RayService manifests for one TPU slice, derived from the slice catalog.

Pure builders: no Kubernetes client, no I/O. The shape (worker replicas = slices, numOfHosts = hosts
per slice, both GKE node selectors, google.com/tpu requests and limits, tpu7x logical devices) comes
from TpuSlice, so the manifest cannot disagree with the node pool or with Ray Train's ScalingConfig.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuflow.errors import UserInputError
from tpuflow.kuberay import API_VERSION, DEFAULT_RAY_VERSION, DEFAULT_UPGRADE_STRATEGY
from tpuflow.kuberay.ray_auth import MIN_TOKEN_AUTH_RAY, auth_mode, with_cluster_auth
from tpuflow.kuberay.serve_config import SERVE_PORT, serve_config_v2
from tpuflow.kubernetes.values import check_env, check_name, check_namespace, check_quantities
from tpuflow.labels import (
    EXPIRES_LABEL,
    SLICE_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    check_labels,
)
from tpuflow.ray.drain import GKE_SPOT_POD_NOTICE_S, prestop_hook
from tpuflow.tpu import TpuSlice
from tpuflow.tpu.slice import TPU_RESOURCE
from tpuflow.validation import check_count

DEFAULT_HEAD_RESOURCES: Mapping[str, str] = {"cpu": "2", "memory": "8Gi"}
WORKER_GROUP = "tpu-group"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
# Ports KubeRay's TPU samples put on the head; the head Service exposes them under these names.
# metrics: Ray's Prometheus exporter (KubeRay's --metrics-export-port); Serve's request counters are read there
HEAD_PORTS: Mapping[str, int] = {"gcs": 6379, "dashboard": 8265, "client": 10001, "serve": SERVE_PORT, "metrics": 8080}
PRESTOP_MARGIN_S = 5  # grace period beyond the preStop hook's hold: Ray's own exit after SIGTERM
MXLA_PORT = 8081  # multi-host TPU workers talk XLA collectives on it (samples: name "mxla")

# DEFAULT_RAY_VERSION and DEFAULT_UPGRADE_STRATEGY ("None": a RayService updates serveConfigV2 in place; the
# other strategies bring up a second RayCluster, i.e. a second TPU slice) live in tpuflow.kuberay, and the
# label keys in tpuflow.labels, so the operators can name them without loading this module at DAG parse time.
UPGRADE_STRATEGIES = ("None", "NewCluster", "NewClusterWithIncrementalUpgrade")

_RAY_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")

# Ray token authentication through KubeRay's spec.authOptions (KubeRay >= 1.5.1, Ray >= 2.52): "token" makes
# KubeRay create a Secret named like the RayCluster holding AUTH_TOKEN_SECRET_KEY, and set RAY_AUTH_MODE and
# RAY_AUTH_TOKEN (secretKeyRef) on every Ray container; "disabled" leaves the dashboard and Jobs API open to
# anything that reaches the head Service.
AUTH_TOKEN_SECRET_KEY = "auth_token"


def spec_hash(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RayClusterTemplate:
    """Everything that shapes the Ray cluster (the RayCluster spec, or a RayService's rayClusterConfig).

    head_resources / worker_resources are container requests (= limits) such as {"cpu": "8",
    "memory": "40G"}; google.com/tpu always comes from the slice. env goes to head and workers.
    """

    tpu: TpuSlice
    image: str
    ray_version: str = DEFAULT_RAY_VERSION
    env: Mapping[str, str] = field(default_factory=dict)
    head_resources: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_HEAD_RESOURCES))
    worker_resources: Mapping[str, str] = field(default_factory=dict)
    service_account: str | None = None
    shm_size: str | None = None
    image_pull_policy: str = "IfNotPresent"
    # queued capacity: the TPU worker pods consume this ProvisioningRequest's nodes (tpuflow.capacity.provisioning_request)
    provisioning_request: str | None = None
    auth_mode: str = "token"
    # seconds a TPU host's Ray node is kept up, drained for preemption, once its VM gets a termination notice
    # (tpuflow.ray.drain.prestop_hook); None: no preStop hook, the pod stops at once
    preemption_notice_s: int | None = GKE_SPOT_POD_NOTICE_S

    def validated(self) -> RayClusterTemplate:
        if not isinstance(self.tpu, TpuSlice):
            raise UserInputError("tpu", self.tpu, "give a TpuSlice (TpuSlice.from_spec(accelerator, topology))")
        self.tpu.require(gke=True, ray=True)
        if not isinstance(self.image, str) or not self.image.strip() or any(c.isspace() for c in self.image):
            raise UserInputError(
                "image",
                self.image,
                f"give a container image with Ray {self.ray_version}, e.g. rayproject/ray:{self.ray_version}-py311",
            )
        if not isinstance(self.ray_version, str) or not _RAY_VERSION_RE.match(self.ray_version):
            raise UserInputError("ray_version", self.ray_version, "write the Ray version as X.Y.Z, e.g. 2.60.0")
        env = check_env("env", self.env)
        for key, value in self.tpu.ray_env.items():
            if key in env and env[key] != value:
                raise UserInputError(
                    f"env[{key!r}]",
                    env[key],
                    f"the {self.tpu.generation.name} slice needs {key}={value}; remove it from env",
                )
        check_quantities("head_resources", self.head_resources, forbidden=(TPU_RESOURCE,))
        check_quantities("worker_resources", self.worker_resources, forbidden=(TPU_RESOURCE,))
        if self.shm_size is not None:
            check_quantities("shm_size", {"size": self.shm_size})
        if self.service_account is not None:
            check_name("service_account", self.service_account, max_len=253)
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise UserInputError("image_pull_policy", self.image_pull_policy, "use Always, IfNotPresent or Never")
        if self.provisioning_request is not None:
            check_name("provisioning_request", self.provisioning_request, max_len=63)
        if self.preemption_notice_s is not None:
            check_count("preemption_notice_s", self.preemption_notice_s, minimum=1, maximum=3600, what="seconds")
        if (
            auth_mode(self.auth_mode) == "token"
            and tuple(int(p) for p in self.ray_version.split(".")) < MIN_TOKEN_AUTH_RAY
        ):
            raise UserInputError(
                "ray_version",
                self.ray_version,
                "Ray token authentication needs Ray 2.52.0 or newer; use a newer image, or turn it off (ray_auth='disabled')",
            )
        return self

    # --- pieces ----------------------------------------------------------------
    def _env(self) -> list[dict[str, str]]:
        merged = {**check_env("env", self.env), **self.tpu.ray_env}
        return [{"name": k, "value": v} for k, v in merged.items()]

    def _shm(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        empty_dir: dict[str, Any] = {"medium": "Memory"}
        if self.shm_size:
            empty_dir["sizeLimit"] = self.shm_size
        return [{"name": "dshm", "emptyDir": empty_dir}], [{"name": "dshm", "mountPath": "/dev/shm"}]

    def _pod_spec(self, container: dict[str, Any]) -> dict[str, Any]:
        volumes, mounts = self._shm()
        container["volumeMounts"] = mounts
        spec: dict[str, Any] = {"containers": [container], "volumes": volumes}
        if self.service_account:
            spec["serviceAccountName"] = self.service_account
        return spec

    def head_group(self, pod_labels: Mapping[str, str]) -> dict[str, Any]:
        res = check_quantities("head_resources", self.head_resources)
        container: dict[str, Any] = {
            "name": HEAD_CONTAINER,
            "image": self.image,
            "imagePullPolicy": self.image_pull_policy,
            **({"env": self._env()} if self._env() else {}),
            "ports": [{"containerPort": port, "name": name} for name, port in HEAD_PORTS.items()],
            "resources": {"requests": dict(res), "limits": dict(res)},
        }
        return {
            # CPU head: no Ray tasks land on it, so the TPU hosts do all the work.
            "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
            "template": {**_pod_metadata(pod_labels), "spec": self._pod_spec(container)},
        }

    def worker_group(self, pod_labels: Mapping[str, str]) -> dict[str, Any]:
        tpu = self.tpu
        res = check_quantities("worker_resources", self.worker_resources)
        requests = {**res, **tpu.tpu_resource_request}
        container: dict[str, Any] = {
            "name": WORKER_CONTAINER,
            "image": self.image,
            "imagePullPolicy": self.image_pull_policy,
            **({"env": self._env()} if self._env() else {}),
            "resources": {"requests": requests, "limits": dict(requests)},
        }
        if tpu.multi_host:
            container["ports"] = [{"containerPort": MXLA_PORT, "name": "mxla"}]
        if self.preemption_notice_s is not None:
            container["lifecycle"] = {"preStop": prestop_hook(self.preemption_notice_s)}
        start_params: dict[str, str] = {}
        if tpu.logical_devices_per_host != tpu.chips_per_host:
            # KubeRay declares TPU = google.com/tpu by itself; tpu7x counts 2 logical devices per chip.
            start_params["resources"] = json.dumps(json.dumps(tpu.ray_worker_resources))
        pod_spec = self._pod_spec(container)
        pod_spec["nodeSelector"] = dict(tpu.node_selector)
        if self.preemption_notice_s is not None:
            # the hook's wait counts against the pod's grace period: a shorter one would cut the notice
            pod_spec["terminationGracePeriodSeconds"] = self.preemption_notice_s + PRESTOP_MARGIN_S
        template: dict[str, Any] = {**_pod_metadata(pod_labels), "spec": pod_spec}
        if self.provisioning_request:
            from tpuflow.capacity.provisioning_request import consume_annotations

            template["metadata"] = {
                **template.get("metadata", {}),
                "annotations": consume_annotations(self.provisioning_request),
            }
        return {
            "groupName": WORKER_GROUP,
            "replicas": tpu.num_slices,
            "minReplicas": tpu.num_slices,
            "maxReplicas": tpu.num_slices,
            "numOfHosts": tpu.num_hosts,
            "rayStartParams": start_params,
            "template": template,
        }

    def cluster_spec(self, pod_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The RayCluster `.spec` (also a RayService's `rayClusterConfig`)."""
        self.validated()
        labels = dict(pod_labels or {})
        spec = {
            "rayVersion": self.ray_version,
            "enableInTreeAutoscaling": False,
            "headGroupSpec": self.head_group(labels),
            "workerGroupSpecs": [self.worker_group(labels)],
        }
        return with_cluster_auth(spec, self.auth_mode)[0]


def auth_secret_name(cluster_name: str, spec: Mapping[str, Any]) -> str | None:
    """The Secret holding a token-authenticated RayCluster's Ray token (None: authentication disabled).

    authOptions.secretName when given, else the one KubeRay creates: the RayCluster's name through
    KubeRay's utils.CheckName (the last 50 characters; a leading digit or punctuation becomes "r").
    """
    auth = spec.get("authOptions") or {}
    if auth.get("mode") != "token":
        return None
    if auth.get("secretName"):
        return str(auth["secretName"])
    name = cluster_name[-50:]
    return f"r{name[1:]}" if name and not name[0].isalpha() else name


def _pod_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The object's labels for its Ray pods, less EXPIRES_LABEL: the expiry is the object's, and a retry's
    later one must not change the spec (its spec-hash would refuse adopting the earlier try's object)."""
    return {key: value for key, value in labels.items() if key != EXPIRES_LABEL}


def _pod_metadata(labels: Mapping[str, str]) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels)}} if labels else {}


def _metadata(
    kind_field: str,
    name: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    spec: Mapping[str, Any],
    tpu: TpuSlice,
) -> dict[str, Any]:
    check_name(kind_field, name)
    check_namespace(namespace)
    meta_annotations = {str(k): str(v) for k, v in (annotations or {}).items()}
    meta_annotations[SLICE_ANNOTATION] = tpu.summary()
    meta_annotations[SPEC_HASH_ANNOTATION] = spec_hash(spec)
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = check_labels("labels", labels)
    meta["annotations"] = meta_annotations
    return meta


def raycluster_manifest(
    template: RayClusterTemplate,
    *,
    name: str,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A KubeRay v1 RayCluster: CPU head (num-cpus 0) plus one TPU worker group of the slice's shape.

    labels go on the RayCluster and its pods (``tpuflow-expires`` on the RayCluster only).
    """
    labels = check_labels("labels", labels)
    spec = template.cluster_spec(_pod_labels(labels))
    return {
        "apiVersion": API_VERSION,
        "kind": "RayCluster",
        "metadata": _metadata("name", name, namespace, labels, annotations, spec, template.tpu),
        "spec": spec,
    }


def rayservice_manifest(
    template: RayClusterTemplate,
    serve_config: object,
    *,
    name: str,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    upgrade_strategy: str = DEFAULT_UPGRADE_STRATEGY,
    pod_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A KubeRay v1 RayService whose serveConfigV2 is the same Serve config the local deploy uses.

    pod_labels (default: labels, less ``tpuflow-expires``) go on the Ray pods; keep per-run labels out of
    them, or every run would change rayClusterConfig and ask KubeRay for a new cluster.
    """
    if upgrade_strategy not in UPGRADE_STRATEGIES:
        raise UserInputError(
            "upgrade_strategy",
            upgrade_strategy,
            f"use one of {', '.join(UPGRADE_STRATEGIES)}; 'None' updates in place and needs no second TPU slice",
        )
    labels = check_labels("labels", labels)
    spec = {
        "serveConfigV2": serve_config_v2(serve_config),
        "upgradeStrategy": {"type": upgrade_strategy},
        "rayClusterConfig": template.cluster_spec(
            _pod_labels(labels) if pod_labels is None else check_labels("pod_labels", pod_labels)
        ),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "RayService",
        "metadata": _metadata("name", name, namespace, labels, annotations, spec, template.tpu),
        "spec": spec,
    }
