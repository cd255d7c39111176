"""Shared plumbing of the KubeRay operators: Kubernetes target, argument checks, the one create/deploy flow.

- ``KubeRayBaseOperator``: where the Kubernetes API is, how long to wait, the argument checks (one
  validation function, run on static values at parse time and on rendered values at the start of
  execute) and the delete wait.
- ``KubeRayApplyOperator``: the one flow of the RayCluster create and the RayService deploy: apply
  (create, or adopt/update what an earlier try or run left), wait (defer or poll), finish (the
  address payload). What ``on_kill`` deletes is ``self._owned``, set while this task waits on an
  object it created.
- ``SliceArgumentsMixin``: the Ray cluster's shape arguments.

Cheap to import: the hooks (kubernetes, providers) and triggers load inside the methods that run in
the worker, never at DAG parse time; the manifest builders and the slice catalog load when a slice
is first checked (at parse time only for static arguments).
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tpuflow.errors import UserInputError
from tpuflow.events import raise_for_event
from tpuflow.kuberay import DEFAULT_RAY_VERSION
from tpuflow.kuberay.addresses import check_address_mode
from tpuflow.kuberay.k8s_values import check_name, check_namespace
from tpuflow.kuberay.links import GKERayHeadPodLink, GKEWorkloadsLink, RayDashboardLink
from tpuflow.labels import DEFAULT_EXPIRES_AFTER
from tpuflow.naming import TaskIdentity
from tpuflow.tpu.slice_argument import slice_is_templated
from tpuflow.validation import check_count

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.kuberay.hooks import KubeRayHook, KubeTarget
    from tpuflow.kuberay.manifests import RayClusterTemplate
    from tpuflow.tpu import TpuSlice
    from tpuflow.tpu.slice_argument import SliceArgument

_GKE_KEYS = ("project_id", "location", "cluster_name")
# (the values a check reads, the check): run at parse time when every value is static, always in execute
ArgumentCheck = tuple[tuple[Any, ...], Callable[[], object]]


def check_gke_cluster(gke_cluster: Mapping[str, Any] | None) -> None:
    if gke_cluster is None:
        return
    if not isinstance(gke_cluster, Mapping):
        raise UserInputError("gke_cluster", gke_cluster, f"give a mapping with {', '.join(_GKE_KEYS)}")
    missing = [k for k in _GKE_KEYS if not gke_cluster.get(k)]
    if missing:
        raise UserInputError("gke_cluster", gke_cluster, f"give {', '.join(_GKE_KEYS)} (missing: {', '.join(missing)})")


def check_seconds(field: str, value: object) -> None:
    """A positive, finite number of seconds (tpuflow.validation.check_seconds)."""
    from tpuflow.validation import check_seconds as _check_seconds

    _check_seconds(field, value)


def check_expires_after(value: object) -> float | None:
    """``expires_after`` in seconds: positive and finite, or None (no ``tpuflow-expires`` label)."""
    from tpuflow.validation import check_seconds as _check_seconds

    return _check_seconds("expires_after", value, optional=True)


def check_choice(field: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise UserInputError(field, value, f"use one of {', '.join(choices)}")


@dataclass(frozen=True)
class OwnedObject:
    """The object a task created and waits on: what killing the task deletes (if it still carries run_key)."""

    kind: str
    name: str
    namespace: str
    run_key: str


class KubeRayBaseOperator(BaseOperator):
    """Where the Kubernetes API is, how long to wait, and how to report.

    :param kubernetes_conn_id: a ``kubernetes`` connection (kube_config_path / kube_config / in_cluster
        extras). Default: ``kubernetes_default`` unless ``gke_cluster`` is given.
    :param gke_cluster: ``{"project_id", "location", "cluster_name"}`` (optional ``use_internal_ip``,
        ``use_dns_endpoint``) of the GKE cluster. Alone, the operator reaches the cluster through the
        google provider's GKE hooks; together with ``kubernetes_conn_id`` it only feeds the console links.
    :param gcp_conn_id: the Google Cloud connection for ``gke_cluster``.
    :param impersonation_chain: service account(s) the GKE hooks impersonate.
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
        self.namespace = namespace
        self.kubernetes_conn_id = kubernetes_conn_id
        self.gke_cluster = gke_cluster
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.wait_timeout = wait_timeout
        self.log_lines = log_lines
        self._hook_cache: KubeRayHook | None = None
        self._target_cache: KubeTarget | None = None

    # --- argument checks: one validation function, two moments ---
    def argument_checks(self) -> list[ArgumentCheck]:
        """Every check of this operator's arguments, with the values it reads (subclasses extend it)."""
        return [
            ((self.gke_cluster,), lambda: check_gke_cluster(self.gke_cluster)),
            ((self.poll_interval,), lambda: check_seconds("poll_interval", self.poll_interval)),
            ((self.wait_timeout,), lambda: check_seconds("wait_timeout", self.wait_timeout)),
            ((self.log_lines,), lambda: check_count("log_lines", self.log_lines, minimum=0)),
            # empty (a Variable left unset) means the connection's namespace, as resolve_namespace() reads it
            ((self.namespace,), lambda: not self.namespace or check_namespace(self.namespace)),
        ]

    def validate_arguments(self, *, static_only: bool = False) -> None:
        """Raise UserInputError for the first bad argument; ``static_only``: skip checks of templated values."""
        for values, check in self.argument_checks():
            # slice_is_templated is is_templated, except that a TpuSlice (an object) counts as static
            if not (static_only and any(slice_is_templated(value) for value in values)):
                check()

    def _check_static_arguments(self) -> None:
        """The parse-time step (called at the end of each operator's ``__init__``): static values only."""
        self.validate_arguments(static_only=True)

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
            self._hook_cache = KubeRayHook.for_target(self.kube_target())
        return self._hook_cache

    def resolve_namespace(self) -> str:
        from tpuflow.kuberay.k8s_values import check_namespace

        return check_namespace(self.namespace or self.kube_hook().default_namespace())

    def wait_gone(self, kind: str, name: str, namespace: str, method_name: str = "execute_complete") -> dict[str, Any]:
        """Defer to KubeRayDeletedTrigger, or poll here; returns the event (non-deferrable only)."""
        deadline = time.time() + float(self.wait_timeout)
        if self.deferrable:
            from tpuflow.kuberay.triggers import KubeRayDeletedTrigger

            self.defer(
                trigger=KubeRayDeletedTrigger(
                    kind=kind,
                    name=name,
                    namespace=namespace,
                    target=self.kube_target().to_dict(),
                    deadline=deadline,
                    poll_interval=float(self.poll_interval),
                ),
                method_name=method_name,
            )
        from tpuflow.kuberay.waits import SyncReader, wait_gone

        return dict(
            asyncio.run(
                wait_gone(
                    SyncReader(self.kube_hook()),
                    kind=kind,
                    name=name,
                    namespace=namespace,
                    deadline=deadline,
                    poll_interval=float(self.poll_interval),
                )
            )
        )

    # --- links ---
    def persist_gke_links(self, context: Context, namespace: str, head_pod: str | None = None) -> None:
        if not self.gke_cluster:
            return
        where = {k: self.gke_cluster[k] for k in _GKE_KEYS}
        GKEWorkloadsLink.persist(context, namespace=namespace, **where)
        if head_pod:
            GKERayHeadPodLink.persist(context, namespace=namespace, pod=head_pod, **where)


class KubeRayApplyOperator(KubeRayBaseOperator):
    """The one create/deploy flow: apply (create, or adopt/update), wait until ready, finish.

    A subclass says what it applies: ``kind`` / ``plural``, ``build_body`` (the manifest, with the
    task's ownership labels and ``expires_after`` as its ``tpuflow-expires`` label), ``reconcile_existing``
    (adopt or update an object of that name, or refuse it), ``rejection`` (the error text when the API
    refuses the create) and ``finish`` (the XCom payload of the ready object).
    """

    kind: ClassVar[str]
    plural: ClassVar[str]

    def __init__(
        self,
        *,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        address_mode: str = "auto",
        expires_after: timedelta | float | None = DEFAULT_EXPIRES_AFTER,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.labels = labels
        self.annotations = annotations
        self.address_mode = address_mode
        self.expires_after = expires_after
        self._owned: OwnedObject | None = None  # what on_kill deletes: set only while waiting in this worker

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.address_mode,), lambda: check_address_mode(self.address_mode)),
            ((self.name,), lambda: self.name is None or check_name("name", self.name)),
            ((self.expires_after,), lambda: check_expires_after(self.expires_after)),
        ]

    # --- what a subclass defines ---
    @abc.abstractmethod
    def build_body(self, context: Context, namespace: str) -> dict[str, Any]: ...

    @abc.abstractmethod
    def reconcile_existing(
        self, hook: KubeRayHook, existing: dict[str, Any], body: Mapping[str, Any], namespace: str
    ) -> dict[str, Any]: ...

    @abc.abstractmethod
    def rejection(self, err: Exception, body: Mapping[str, Any], namespace: str) -> str: ...

    @abc.abstractmethod
    def finish(self, context: Context, name: str, namespace: str) -> dict[str, Any]: ...

    def deletes_on_kill(self) -> bool:
        """Whether killing the waiting task deletes the object it created."""
        return True

    def owned_body(self, context: Context, namespace: str) -> dict[str, Any]:
        """``build_body`` with the task instance's full owner record annotated (whatever built the body: a
        template or the user's manifest), so the orphan reaper judges the object by its exact run."""
        body = self.build_body(context, namespace)
        meta = body["metadata"]
        meta["annotations"] = {**(meta.get("annotations") or {}), **owner_annotations(context)}
        return body

    # --- the flow ---
    def execute(self, context: Context) -> dict[str, Any]:
        from kubernetes.client import ApiException

        from tpuflow.kuberay.status import raycluster_verdict, rayservice_verdict

        self.validate_arguments()
        hook = self.kube_hook()
        namespace = self.resolve_namespace()
        body = self.owned_body(context, namespace)
        name = body["metadata"]["name"]
        self.persist_gke_links(context, namespace)
        obj = self._apply_existing(hook, body, namespace)
        if obj is None:
            try:
                obj = hook.create(self.plural, body, namespace)
                self.log.info("Created %s %s/%s", self.kind, namespace, name)
            except ApiException as err:
                if err.status != 409:
                    raise AirflowFailException(self.rejection(err, body, namespace)) from err
                obj = self._apply_existing(hook, body, namespace)  # created concurrently (a second try)
        verdict = (raycluster_verdict if self.kind == "RayCluster" else rayservice_verdict)(obj)
        if verdict.ready:
            return self.finish(context, name, namespace)
        self.log.info(
            "Waiting up to %.0fs for %s %s/%s: %s", self.wait_timeout, self.kind, namespace, name, verdict.reason
        )
        event = self.wait_ready(name, namespace, run_key=TaskIdentity.from_context(context).key)
        return self.execute_complete(context, event)

    def _apply_existing(self, hook: KubeRayHook, body: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        existing = hook.get(self.plural, name, namespace)
        if existing is None:
            return None
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise AirflowException(
                f"{self.kind} {namespace}/{name} is being deleted (a teardown of an earlier "
                "try?); retry once it is gone"
            )
        return self.reconcile_existing(hook, existing, body, namespace)

    def wait_ready(self, name: str, namespace: str, *, run_key: str) -> dict[str, Any]:
        """Defer to KubeRayReadyTrigger, or poll here; returns the event (non-deferrable only).

        Killing the task while it waits deletes the object if it carries this task's run-key label (the
        task created it) and ``deletes_on_kill()``: the trigger's on_kill, or this operator's.
        """
        deadline = time.time() + float(self.wait_timeout)
        owner = run_key if self.deletes_on_kill() else None
        if self.deferrable:
            from tpuflow.kuberay.triggers import KubeRayReadyTrigger

            self.defer(
                trigger=KubeRayReadyTrigger(
                    kind=self.kind,
                    name=name,
                    namespace=namespace,
                    target=self.kube_target().to_dict(),
                    deadline=deadline,
                    poll_interval=float(self.poll_interval),
                    log_lines=int(self.log_lines),
                    owner_run_key=owner,
                ),
                method_name="execute_complete",
            )
        from tpuflow.kuberay.waits import SyncReader, wait_ready

        self._owned = OwnedObject(self.kind, name, namespace, owner) if owner else None
        try:
            return dict(
                asyncio.run(
                    wait_ready(
                        SyncReader(self.kube_hook()),
                        kind=self.kind,
                        name=name,
                        namespace=namespace,
                        deadline=deadline,
                        poll_interval=float(self.poll_interval),
                        log_lines=int(self.log_lines),
                    )
                )
            )
        finally:
            self._owned = None

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        raise_for_event(event, f"{self.kind} {event.get('namespace')}/{event.get('name')}")
        return self.finish(context, event["name"], event["namespace"])

    def on_kill(self) -> None:
        """Killed while waiting in the worker (not deferred): delete the object this task created."""
        owned = self._owned
        if owned is None:
            return
        from tpuflow.kuberay.triggers import owned_by

        hook = self.kube_hook()
        if owned_by(hook.get(self.plural, owned.name, owned.namespace), owned.run_key):
            self.log.warning("Task killed: deleting %s %s/%s", owned.kind, owned.namespace, owned.name)
            hook.delete(self.plural, owned.name, owned.namespace)


class SliceArgumentsMixin:
    """The Ray cluster's shape arguments: ``tpu_slice`` (tpuflow.tpu.slice_argument: a TpuSlice, its
    to_dict(), or a mapping whose values may be templates), plus image, env and resources (documented on
    the operators that take them)."""

    def __init__(
        self,
        *,
        tpu_slice: SliceArgument | None = None,
        image: str | None = None,
        ray_version: str = DEFAULT_RAY_VERSION,
        env: Mapping[str, str] | None = None,
        head_resources: Mapping[str, str] | None = None,
        worker_resources: Mapping[str, str] | None = None,
        service_account: str | None = None,
        shm_size: str | None = None,
        ray_auth: str = "token",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tpu_slice = tpu_slice
        self.image = image
        self.ray_version = ray_version
        self.env = env
        self.head_resources = head_resources
        self.worker_resources = worker_resources
        self.service_account = service_account
        self.shm_size = shm_size
        self.ray_auth = ray_auth

    def slice_values(self) -> tuple[Any, ...]:
        """What the cluster shape is built from (the check runs at parse time only when all are static)."""
        return (
            self.tpu_slice,
            self.image,
            self.env,
            self.ray_version,
            self.head_resources,
            self.worker_resources,
            self.service_account,
            self.shm_size,
            self.ray_auth,
        )

    def resolved_slice(self) -> TpuSlice:
        """The (rendered) ``tpu_slice``, in a shape GKE and Ray take; else one line naming ``tpu_slice.<key>``."""
        from tpuflow.tpu.slice_argument import resolve_slice

        return resolve_slice(self.tpu_slice, gke=True, ray=True)

    def build_template(self) -> RayClusterTemplate:
        from tpuflow.kuberay.manifests import RayClusterTemplate

        kwargs: dict[str, Any] = {}
        if self.head_resources is not None:
            kwargs["head_resources"] = dict(self.head_resources)
        return RayClusterTemplate(
            tpu=self.resolved_slice(),
            image=self.image or "",
            ray_version=self.ray_version or DEFAULT_RAY_VERSION,
            env=dict(self.env or {}),
            worker_resources=dict(self.worker_resources or {}),
            service_account=self.service_account,
            shm_size=self.shm_size,
            auth_mode=self.ray_auth,
            **kwargs,
        ).validated()


def object_name(context: Context, explicit: str | None, task_id: str | None = None) -> str:
    """The object's name: the explicit one (checked), else the task instance's deterministic name."""
    from tpuflow.kuberay.k8s_values import check_name
    from tpuflow.kuberay.manifests import resource_name

    if explicit:
        return check_name("name", explicit)
    who = TaskIdentity.from_context(context, task_id)
    return resource_name(who.dag_id, who.run_id, who.task_id, who.map_index)


def owner_annotations(context: Context) -> dict[str, str]:
    """The task instance's full owner record (dag, run, task, map index) as the object's annotation."""
    from tpuflow.kuberay.manifests import ownership_annotations

    who = TaskIdentity.from_context(context)
    return ownership_annotations(who.dag_id, who.run_id, who.task_id, who.map_index)


def owner_labels(
    context: Context, extra: Mapping[str, str] | None, expires_after: timedelta | float | None = None
) -> dict[str, str]:
    """``extra`` plus the task instance's ownership labels; with ``expires_after`` (from now) the
    ``tpuflow-expires`` label too, so the reaper takes the object past it whatever its run's state."""
    from tpuflow.kuberay.manifests import ownership_labels

    who = TaskIdentity.from_context(context)
    seconds = check_expires_after(expires_after)
    expires_at = None if seconds is None else int(time.time() + seconds)
    owned = ownership_labels(who.dag_id, who.run_id, who.task_id, who.map_index, expires_at)
    return {**dict(extra or {}), **owned}
