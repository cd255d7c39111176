"""Shared plumbing of the KubeRay operators: Kubernetes target, argument checks, the one create/deploy flow.

- ``KubeRayBaseOperator``: the Kubernetes-object operator skeleton (tpuflow.kubernetes.operator_base:
  where the API is, how long to wait, one argument-check shape) on KubeRay's hook, for one KubeRay kind
  (``kuberay_kind``, tpuflow.kuberay.kinds: its name, plural, manifest builder, verdict and diagnosis),
  plus the console links.
- ``KubeRayApplyOperator``: the one flow of the RayCluster create and the RayService deploy: apply
  (create, or adopt/update what an earlier try or run left), wait, finish (the address payload). Every
  waiting KubeRay operator follows one skeleton: ``execute`` does the work up to the wait, then
  ``execute_async`` (defer to the trigger) or ``execute_sync`` (run the trigger's own wait coroutine in
  this worker), and both hand the event to ``execute_complete``. What ``on_kill`` deletes is
  ``self._owned``, set while this task waits in the worker on an object it created.
- ``SliceArgumentsMixin``: the Ray cluster's shape arguments.

Cheap to import: the hooks (kubernetes, providers) and triggers load inside the methods that run in
the worker, never at DAG parse time; the manifest builders and the slice catalog load when a slice
is first checked (at parse time only for static arguments).
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, cast

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tpuflow.arguments import ArgumentCheck
from tpuflow.docstrings import InheritedParamDocs
from tpuflow.events import raise_for_event
from tpuflow.failure_callbacks import chain_on_failure
from tpuflow.kuberay import DEFAULT_RAY_VERSION
from tpuflow.kuberay.addresses import check_address_mode
from tpuflow.kuberay.kinds import KubeRayKind
from tpuflow.kuberay.links import GKERayHeadPodLink, GKEWorkloadsLink, RayDashboardLink
from tpuflow.kubernetes.operator_base import GKE_CLUSTER_KEYS, KubernetesBaseOperator
from tpuflow.kubernetes.ownership import check_expires_after, object_name, owner_annotations
from tpuflow.kubernetes.values import check_name
from tpuflow.labels import DEFAULT_EXPIRES_AFTER, OWNER_ANNOTATION
from tpuflow.naming import TaskIdentity
from tpuflow.ray.cluster_source import ClusterTampered
from tpuflow.tpu.slice_argument import resolve_slice

if TYPE_CHECKING:
    from airflow.sdk import BaseOperatorLink, Context

    from tpuflow.kuberay.hooks import KubeRayHook
    from tpuflow.kuberay.manifests import RayClusterTemplate
    from tpuflow.kubernetes.hooks import KubeTarget
    from tpuflow.tpu import TpuSlice
    from tpuflow.tpu.slice_argument import SliceArgument


@dataclass(frozen=True)
class OwnedObject:
    """The object a task created and waits on: what killing the task deletes (if it still carries run_key)."""

    kind: str
    name: str
    namespace: str
    run_key: str


class KubeRayBaseOperator(KubernetesBaseOperator):
    """The Kubernetes-object operator skeleton (tpuflow.kubernetes.operator_base) on KubeRay's hook, for
    the KubeRay kind ``kuberay_kind``, with the Ray / GKE console links."""

    operator_extra_links: Collection[BaseOperatorLink] = (RayDashboardLink(), GKEWorkloadsLink(), GKERayHeadPodLink())
    ui_color = "#e6f0ff"
    kuberay_kind: ClassVar[type[KubeRayKind]]

    @property
    def kind(self) -> str:
        """The kind's name, as messages, events and return values carry it."""
        return self.kuberay_kind.name

    @property
    def plural(self) -> str:
        """The kind's plural, as the custom-object API names it."""
        return self.kuberay_kind.plural

    def hook_class(self) -> type[KubeRayHook]:
        from tpuflow.kuberay.hooks import KubeRayHook

        return KubeRayHook

    def kube_hook(self) -> KubeRayHook:
        return cast("KubeRayHook", super().kube_hook())

    def wait_arguments(self, name: str, namespace: str) -> dict[str, Any]:
        """What a wait on one of this kind's objects takes (the trigger's kwargs; the sync path's too)."""
        return {
            "kind": self.kind,
            "name": name,
            "namespace": namespace,
            "deadline": time.time() + float(self.wait_timeout),
            "poll_interval": float(self.poll_interval),
        }

    # --- links ---
    def persist_gke_links(self, context: Context, namespace: str, head_pod: str | None = None) -> None:
        if not self.gke_cluster:
            return
        where = {k: self.gke_cluster[k] for k in GKE_CLUSTER_KEYS}
        GKEWorkloadsLink.persist(context, namespace=namespace, **where)
        if head_pod:
            GKERayHeadPodLink.persist(context, namespace=namespace, pod=head_pod, **where)


class KubeRayApplyOperator(KubeRayBaseOperator):
    """The one create/deploy flow: apply (create, or adopt/update), wait until ready, finish.

    A subclass says what it applies: ``kuberay_kind``, ``build_body`` (the manifest, with the task's
    ownership labels and ``expires_after`` as its ``tpuflow-expires`` label), ``reconcile_existing``
    (adopt or update an object of that name, or refuse it), ``rejection`` (the error text when the API
    refuses the create) and ``finish`` (the XCom payload of the ready object).

    :param log_lines: head pod log lines to include on failure or timeout.
    """

    template_fields: Sequence[str] = (*KubeRayBaseOperator.template_fields, "name", "labels", "expires_after")

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
        chain_on_failure(self, self._delete_after_final_failure)

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

    @abc.abstractmethod
    def connection_payload(self, hook: KubeRayHook, target: KubeTarget, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The XCom payload (addresses, token reference) of ``obj``, a ready object of this kind."""
        ...

    def cluster_from_reference(self, reference: Mapping[str, Any], context: Context) -> dict[str, Any]:
        """The payload of the object ``reference`` names (tpuflow.ray.cluster_source), read again through this
        task's own connection and namespace; only an object whose owner record is this task instance of this
        run qualifies."""
        hook, target, namespace = cast("tuple[KubeRayHook, KubeTarget, str]", self.configured_access(context))
        name = reference.get("name")
        if reference.get("kind", self.kind) != self.kind or reference.get("namespace", namespace) != namespace:
            raise ClusterTampered(
                "cluster",
                {k: reference.get(k) for k in ("kind", "name", "namespace")},
                f"task {self.task_id} makes a {self.kind} in namespace {namespace}; clear {self.task_id} to make it again",
            )
        obj = hook.get(self.plural, check_name("cluster['name']", name), namespace) if name else None
        if obj is None or not self._made_by_this_task(obj, context):
            raise ClusterTampered(
                "cluster['name']",
                name,
                f"no {self.kind} {namespace}/{name} made by task {self.task_id} of this run; clear {self.task_id} "
                "to make it again",
            )
        return self.connection_payload(hook, target, obj)

    def _made_by_this_task(self, obj: Mapping[str, Any] | None, context: Context) -> bool:
        """Whether ``obj`` exists and its owner record is this task instance (dag, run, task, map index)."""
        owner = ((obj or {}).get("metadata") or {}).get("annotations", {}).get(OWNER_ANNOTATION)
        return obj is not None and TaskIdentity.from_record(owner) == TaskIdentity.from_context(context, self.task_id)

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
        """Apply the object; ready already: finish; else wait in the triggerer or in this worker."""
        from kubernetes.client import ApiException

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
        verdict = self.kuberay_kind.verdict(obj)
        if verdict.ready:
            return self.finish(context, name, namespace)
        self.log.info(
            "Waiting up to %.0fs for %s %s/%s: %s", self.wait_timeout, self.kind, namespace, name, verdict.reason
        )
        wait = {**self.wait_arguments(name, namespace), "log_lines": int(self.log_lines)}
        # Killing the task while it waits deletes the object if it carries this task's run-key label (the
        # task created it) and deletes_on_kill(): the trigger's on_kill, or this operator's.
        run_key = TaskIdentity.from_context(context).key
        owned = OwnedObject(self.kind, name, namespace, run_key) if self.deletes_on_kill() else None
        if self.deferrable:
            self.execute_async(context, wait, owned)
        return self.execute_sync(context, wait, owned)

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

    def execute_async(self, context: Context, wait: dict[str, Any], owned: OwnedObject | None) -> None:
        """Defer: KubeRayReadyTrigger waits in the triggerer (and deletes ``owned`` if the task is killed)."""
        from tpuflow.kuberay.triggers import KubeRayReadyTrigger

        self.defer(
            trigger=KubeRayReadyTrigger(
                target=self.kube_target().to_dict(), owner_run_key=owned.run_key if owned else None, **wait
            ),
            method_name="execute_complete",
        )

    def execute_sync(self, context: Context, wait: dict[str, Any], owned: OwnedObject | None) -> dict[str, Any]:
        """Wait in this worker: the trigger's own wait, run here (``on_kill`` deletes ``owned`` meanwhile)."""
        from tpuflow.kuberay.waits import SyncReader, wait_ready

        self._owned = owned
        try:
            event = asyncio.run(wait_ready(SyncReader(self.kube_hook()), **wait))
        finally:
            self._owned = None
        return self.execute_complete(context, dict(event))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The wait's outcome, for both paths: the trigger's event, or the same event from execute_sync."""
        raise_for_event(event, f"{self.kind} {event.get('namespace')}/{event.get('name')}")
        return self.finish(context, event["name"], event["namespace"])

    def _delete_after_final_failure(self, context: Context) -> None:
        """No try left: delete the object this task instance made (its owner record says so), since Airflow skips a
        teardown whose setups all failed (tpuflow.failure_callbacks). A retry adopts the object instead."""
        if not self.deletes_on_kill():
            return
        try:
            hook, namespace = self.kube_hook(), self.resolve_namespace()
            name = object_name(context, self.name)
            if not self._made_by_this_task(hook.get(self.plural, name, namespace), context):
                return
            self.log.warning(
                "Task failed: deleting the %s %s/%s it made (a teardown is skipped when its setup failed)",
                self.kind,
                namespace,
                name,
            )
            hook.delete(self.plural, name, namespace, foreground=self.kuberay_kind.delete_foreground)
        except Exception as err:  # noqa: BLE001 - a callback must not hide the task's own error
            self.log.warning("Could not delete the %s this task made (%s); `tpuflow reap` removes it", self.kind, err)

    def on_kill(self) -> None:
        """Killed while waiting in the worker (not deferred): delete the object this task created."""
        owned = self._owned
        if owned is None:
            return
        from tpuflow.kuberay.triggers import owned_by

        hook = self.kube_hook()
        if owned_by(hook.get(self.plural, owned.name, owned.namespace), owned.run_key):
            self.log.warning("Task killed: deleting %s %s/%s", owned.kind, owned.namespace, owned.name)
            hook.delete(self.plural, owned.name, owned.namespace, foreground=self.kuberay_kind.delete_foreground)


class SliceArgumentsMixin(InheritedParamDocs):
    """The Ray cluster's shape arguments: the slice, the image, env and resources.

    :param tpu_slice: the slice (tpuflow.tpu.slice_argument): a TpuSlice, its to_dict(), or
        ``{"accelerator", "topology", "machine_type"?, "num_slices"?}`` (accelerator: TPU generation or
        accelerator name, e.g. "v6e", "TPU-V6E"; topology e.g. "4x4"; machine_type of the TPU hosts, default
        the slice's; num_slices: worker replicas) whose values may be templates; templated.
    :param image: container image with Ray ``ray_version`` (head and TPU workers); templated.
    :param ray_version: the Ray version in the image (X.Y.Z).
    :param env: environment for head and workers (the slice's own, e.g. tpu7x's, is added); templated.
    :param head_resources: head container requests = limits (default cpu 2, memory 8Gi; Ray num-cpus 0).
    :param worker_resources: extra TPU-host container requests = limits (cpu, memory); google.com/tpu
        always comes from the slice.
    :param service_account: Kubernetes service account of the Ray pods.
    :param shm_size: size limit of the /dev/shm memory volume (default: unlimited).
    :param provisioning_request_name: queued capacity: the ProvisioningRequest (e.g. the ``name`` in
        GKECreateProvisioningRequestOperator's XCom) whose nodes the TPU worker pods consume, by its
        consume-provisioning-request annotations; None / empty: none, the pods take whatever pool fits. Templated.
    """

    # the templated ones, for the template_fields of the operators that take them
    slice_template_fields: ClassVar[tuple[str, ...]] = ("image", "env", "tpu_slice", "provisioning_request_name")

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
        provisioning_request_name: str | None = None,
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
        self.provisioning_request_name = provisioning_request_name

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
            self.provisioning_request_name,
        )

    def resolved_slice(self) -> TpuSlice:
        """The (rendered) ``tpu_slice``, in a shape GKE and Ray take; else one line naming ``tpu_slice.<key>``."""

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
            provisioning_request=self.provisioning_request_name or None,
            **kwargs,
        ).validated()
