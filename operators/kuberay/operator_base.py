"""Shared plumbing of the KubeRay operators: Kubernetes target, slice arguments, waiting, identity.

Cheap to import: the hooks (kubernetes, providers) and triggers load inside the methods that run in
the worker, never at DAG parse time; the manifest builders and the slice catalog load when a slice
is first checked (at parse time only for static arguments).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowException
from tpuflow.errors import UserInputError
from tpuflow.kuberay import DEFAULT_RAY_VERSION
from tpuflow.kuberay.links import GKERayHeadPodLink, GKEWorkloadsLink, RayDashboardLink

if TYPE_CHECKING:
    from airflow.sdk import Context
    from tpuflow.kuberay.hooks import KubeRayHook, KubeTarget
    from tpuflow.kuberay.manifests import RayClusterTemplate
    from tpuflow.tpu import TpuSlice

_GKE_KEYS = ("project_id", "location", "cluster_name")


def identity(context: Context, task_id: str | None = None) -> tuple[str, str, str, int]:
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return ti.dag_id, ti.run_id, task_id or ti.task_id, -1 if map_index is None else int(map_index)


def _templated(*values: object) -> bool:
    return any(isinstance(v, str) and "{{" in v for v in values)


class KubeRayBaseOperator(BaseOperator):
    """Where the Kubernetes API is, how long to wait, and how to report.

    :param kubernetes_conn_id: a ``kubernetes`` connection (kube_config_path / kube_config / in_cluster
        extras). Default: ``kubernetes_default`` unless ``gke_cluster`` is given.
    :param gke_cluster: ``{"project_id", "location", "cluster_name"}`` (optional ``use_internal_ip``,
        ``use_dns_endpoint``) of the GKE cluster. Alone, the operator reaches the cluster through the
        google provider's GKE hooks; together with ``kubernetes_conn_id`` it only feeds the console links.
    :param namespace: Kubernetes namespace; default: the connection's ``namespace`` extra, else "default".
    :param deferrable: wait in the triggerer (KubeRay status polling with kubernetes_asyncio).
    :param poll_interval: seconds between status reads.
    :param wait_timeout: seconds until the task fails with KubeRay's reason, pod states, Warning
        events and the head pod's last log lines.
    :param log_lines: head pod log lines to include on failure or timeout.
    """

    template_fields: Sequence[str] = ("namespace", "kubernetes_conn_id", "gke_cluster", "gcp_conn_id")
    operator_extra_links = (RayDashboardLink(), GKEWorkloadsLink(), GKERayHeadPodLink())
    ui_color = "#e6f0ff"

    def __init__(
        self,
        *,
        namespace: str | None = None,
        kubernetes_conn_id: str | None = None,
        gke_cluster: Mapping[str, Any] | None = None,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        wait_timeout: float = 1800.0,
        log_lines: int = 50,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if gke_cluster is not None:
            missing = [k for k in _GKE_KEYS if not (gke_cluster or {}).get(k)]
            if missing:
                raise UserInputError("gke_cluster", gke_cluster, f"give {', '.join(_GKE_KEYS)} (missing: "
                                     f"{', '.join(missing)})")
        for field, value in (("poll_interval", poll_interval), ("wait_timeout", wait_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise UserInputError(field, value, "give a positive number of seconds")
        self.namespace = namespace
        self.kubernetes_conn_id = kubernetes_conn_id
        self.gke_cluster = dict(gke_cluster) if gke_cluster else None
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.deferrable = deferrable
        self.poll_interval = float(poll_interval)
        self.wait_timeout = float(wait_timeout)
        self.log_lines = int(log_lines)
        self._hook_cache: KubeRayHook | None = None
        self._target_cache: KubeTarget | None = None

    # --- Kubernetes access (worker side) ---
    def kube_target(self) -> KubeTarget:
        from tpuflow.kuberay.hooks import KubeTarget, resolve_gke_target

        if self._target_cache is None:
            if self.gke_cluster and not self.kubernetes_conn_id:
                self._target_cache = resolve_gke_target(self.gke_cluster, self.gcp_conn_id, self.impersonation_chain)
            else:
                self._target_cache = KubeTarget(kubernetes_conn_id=self.kubernetes_conn_id or "kubernetes_default")
        return self._target_cache

    def kube_hook(self) -> KubeRayHook:
        from tpuflow.kuberay.hooks import KubeRayHook

        if self._hook_cache is None:
            self._hook_cache = KubeRayHook(self.kube_target())
        return self._hook_cache

    def resolve_namespace(self) -> str:
        from tpuflow.kuberay.k8s_values import check_namespace

        return check_namespace(self.namespace or self.kube_hook().default_namespace())

    # --- waiting ---
    def wait_ready(self, kind: str, name: str, namespace: str, method_name: str = "execute_complete",
                   owner_run_key: str | None = None) -> dict[str, Any]:
        """Defer to KubeRayReadyTrigger, or poll here; returns the event (non-deferrable only).

        ``owner_run_key``: this task's run-key label; killing the task while it waits deletes the
        object if it carries that label (the task created it), by the trigger's or this on_kill.
        """
        deadline = time.time() + self.wait_timeout
        if self.deferrable:
            from tpuflow.kuberay.triggers import KubeRayReadyTrigger

            self.defer(
                trigger=KubeRayReadyTrigger(kind=kind, name=name, namespace=namespace,
                                            target=self.kube_target().to_dict(), deadline=deadline,
                                            poll_interval=self.poll_interval, log_lines=self.log_lines,
                                            owner_run_key=owner_run_key),
                method_name=method_name,
            )
        from tpuflow.kuberay.waits import SyncReader, wait_ready

        self._waiting_for = (kind, name, namespace, owner_run_key)
        try:
            return asyncio.run(wait_ready(SyncReader(self.kube_hook()), kind=kind, name=name, namespace=namespace,
                                          deadline=deadline, poll_interval=self.poll_interval,
                                          log_lines=self.log_lines))
        finally:
            self._waiting_for = None

    def on_kill(self) -> None:
        """Killed while waiting in the worker (not deferred): delete the object this task created."""
        waiting_for = getattr(self, "_waiting_for", None)
        if not waiting_for or not waiting_for[3]:
            return
        from tpuflow.kuberay.triggers import owned_by
        from tpuflow.kuberay.waits import KINDS

        kind, name, namespace, run_key = waiting_for
        hook = self.kube_hook()
        if owned_by(hook.get(KINDS[kind], name, namespace), run_key):
            self.log.warning("Task killed: deleting %s %s/%s", kind, namespace, name)
            hook.delete(KINDS[kind], name, namespace)

    def wait_gone(self, kind: str, name: str, namespace: str, method_name: str = "execute_complete") -> dict[str, Any]:
        deadline = time.time() + self.wait_timeout
        if self.deferrable:
            from tpuflow.kuberay.triggers import KubeRayDeletedTrigger

            self.defer(
                trigger=KubeRayDeletedTrigger(kind=kind, name=name, namespace=namespace,
                                              target=self.kube_target().to_dict(), deadline=deadline,
                                              poll_interval=self.poll_interval),
                method_name=method_name,
            )
        from tpuflow.kuberay.waits import SyncReader, wait_gone

        return asyncio.run(wait_gone(SyncReader(self.kube_hook()), kind=kind, name=name, namespace=namespace,
                                     deadline=deadline, poll_interval=self.poll_interval))

    @staticmethod
    def raise_for_event(event: Mapping[str, Any], expected: str) -> None:
        if not isinstance(event, Mapping) or event.get("status") != expected:
            event = event if isinstance(event, Mapping) else {"message": repr(event)}
            text = str(event.get("message") or "no message")
            if event.get("diagnostics"):
                text += "\n" + str(event["diagnostics"])
            raise AirflowException(text)

    # --- links ---
    def persist_gke_links(self, context: Context, namespace: str, head_pod: str | None = None) -> None:
        if not self.gke_cluster:
            return
        where = {k: self.gke_cluster[k] for k in ("project_id", "location", "cluster_name")}
        GKEWorkloadsLink.persist(context, namespace=namespace, **where)
        if head_pod:
            GKERayHeadPodLink.persist(context, namespace=namespace, pod=head_pod, **where)


class SliceArgumentsMixin:
    """The Ray cluster's shape arguments, validated at parse time when they are not templated."""

    def init_slice(
        self,
        *,
        tpu: TpuSlice | Mapping[str, Any] | None,
        accelerator: str | None,
        topology: str | None,
        machine_type: str | None,
        num_slices: int | str,
        image: str | None,
        ray_version: str,
        env: Mapping[str, str] | None,
        head_resources: Mapping[str, str] | None,
        worker_resources: Mapping[str, str] | None,
        service_account: str | None,
        shm_size: str | None,
    ) -> None:
        if tpu is not None:
            from tpuflow.tpu import TpuSlice

            if accelerator or topology:
                raise UserInputError("tpu", tpu, "give either tpu or accelerator/topology, not both")
            if isinstance(tpu, Mapping):
                tpu = TpuSlice.from_dict(dict(tpu))
            if not isinstance(tpu, TpuSlice):
                raise UserInputError("tpu", tpu, "give a TpuSlice or its to_dict()")
            accelerator, topology = tpu.generation.name, tpu.topology
            machine_type, num_slices = tpu.machine_type, tpu.num_slices
        self.accelerator, self.topology, self.machine_type = accelerator, topology, machine_type
        self.num_slices = num_slices
        self.image, self.ray_version = image, ray_version or DEFAULT_RAY_VERSION
        self.env = dict(env or {})
        self.head_resources = dict(head_resources) if head_resources is not None else None
        self.worker_resources = dict(worker_resources or {})
        self.service_account, self.shm_size = service_account, shm_size

    def slice_is_templated(self) -> bool:
        return _templated(self.accelerator, self.topology, self.machine_type, self.num_slices, self.image,
                          *self.env.values())

    def build_template(self) -> RayClusterTemplate:
        from tpuflow.kuberay.manifests import RayClusterTemplate
        from tpuflow.tpu import TpuSlice

        if not self.accelerator or not self.topology:
            raise UserInputError("topology" if self.accelerator else "accelerator",
                                 self.topology if self.accelerator else self.accelerator,
                                 "give the TPU slice: tpu=TpuSlice.from_spec(...) or accelerator= and topology=")
        tpu = TpuSlice.from_spec(self.accelerator, self.topology, self.machine_type or None, self.num_slices)
        kwargs: dict[str, Any] = {}
        if self.head_resources is not None:
            kwargs["head_resources"] = self.head_resources
        return RayClusterTemplate(
            tpu=tpu, image=self.image or "", ray_version=self.ray_version, env=self.env,
            worker_resources=self.worker_resources, service_account=self.service_account, shm_size=self.shm_size,
            **kwargs,
        ).validated()


def object_name(context: Context, explicit: str | None, task_id: str | None = None) -> str:
    from tpuflow.kuberay.k8s_values import check_name
    from tpuflow.kuberay.manifests import resource_name

    if explicit:
        return check_name("name", explicit)
    return resource_name(*identity(context, task_id))


def owner_labels(context: Context, extra: Mapping[str, str] | None) -> dict[str, str]:
    from tpuflow.kuberay.manifests import ownership_labels

    return {**dict(extra or {}), **ownership_labels(*identity(context))}
