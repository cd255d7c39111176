"""Operators for TPU capacity that arrives later: queued provisioning (ProvisioningRequest) and flex-start.

- ``GKECreateProvisioningRequestOperator``: for a pool created with ``capacity="queued"``, create the
  PodTemplate(s) and the ProvisioningRequest asking for the slice's nodes (names from the task
  instance, so a retry adopts them), then wait (deferrable) for ``Provisioned=True``. It fails with
  GKE's reason on ``Failed`` / ``CapacityRevoked`` / ``BookingExpired`` or at ``wait_timeout``, and then
  deletes what it created. The TPU worker pods must carry ``tpuflow.capacity.provisioning_request.
  consume_annotations(name)`` (the returned ``annotations``; RayClusterTemplate.provisioning_request).
- ``GKEDeleteProvisioningRequestOperator``: delete the request and its PodTemplates; a teardown.
- ``GKEWaitForFlexStartCapacityOperator``: wait until GKE's autoscaler has grown a flex-start pool
  for the TPU pods of a RayCluster, reporting the elapsed time, failing with the autoscaler's reason.

Given ``node_pool_task_id`` (a GKECreateTPUNodePoolOperator task), the first two act only when that
task's pools got the capacity they are for (after a fallback, e.g. queued -> on-demand, there is
nothing to request or wait for). Cheap to import: hooks and triggers load inside execute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tpuflow.arguments import ArgumentCheck
from tpuflow.errors import UserInputError
from tpuflow.events import raise_for_event
from tpuflow.kubernetes.operator_base import KubernetesBaseOperator
from tpuflow.kubernetes.ownership import object_name
from tpuflow.kubernetes.values import check_name
from tpuflow.labels import RUN_KEY_LABEL, kubernetes_ownership_labels
from tpuflow.naming import TaskIdentity
from tpuflow.templating import is_true

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.capacity.hooks import CapacityHook
    from tpuflow.capacity.provisioning_request import ProvisioningRequestPlan
    from tpuflow.tpu import TpuSlice
    from tpuflow.tpu.slice_argument import SliceArgument


def _pool_result(context: Context, task_id: str) -> Mapping[str, Any]:
    result = context["ti"].xcom_pull(task_ids=task_id)
    if not isinstance(result, Mapping) or not result.get("node_pool_names"):
        raise AirflowException(f"task {task_id} returned no node pools (did it run?)")
    return result


def _pool_capacity(result: Mapping[str, Any]) -> str:
    """The capacity the pools actually got (the first pool's; a fallback applies to all of them)."""
    names = list(result["node_pool_names"])
    return str((result.get("capacity") or {}).get(names[0]) or "")


class _CapacityOperator(KubernetesBaseOperator):
    """The Kubernetes-object operator skeleton on the capacity hook, and the slice."""

    operator_extra_links = ()
    ui_color = "#d5e8ff"

    def __init__(
        self,
        *,
        tpu_slice: SliceArgument | None = None,
        node_pool_task_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tpu_slice = tpu_slice
        self.node_pool_task_id = node_pool_task_id

    def hook_class(self) -> type[CapacityHook]:
        from tpuflow.capacity.hooks import CapacityHook

        return CapacityHook

    def kube_hook(self) -> CapacityHook:
        return cast("CapacityHook", super().kube_hook())

    def resolved_slice(self) -> TpuSlice:
        """The (rendered) ``tpu_slice``, in a shape GKE takes; else one line naming ``tpu_slice.<key>``."""
        from tpuflow.gke.nodepool_spec import gke_slice

        return gke_slice(self.tpu_slice)

    def _skip(self, context: Context, wanted: str) -> dict[str, Any] | None:
        """The node pool task's capacity when it is not ``wanted`` (nothing to do), else None."""
        if not self.node_pool_task_id:
            return None
        capacity = _pool_capacity(_pool_result(context, self.node_pool_task_id))
        if capacity == wanted:
            return None
        self.log.info(
            "Node pools of %s have %s capacity, not %s: nothing to do", self.node_pool_task_id, capacity, wanted
        )
        return {"name": None, "capacity": capacity, "skipped": f"the node pools are {capacity}, not {wanted}"}


class GKECreateProvisioningRequestOperator(_CapacityOperator):
    """Ask GKE for a queued pool's nodes with a ProvisioningRequest and wait until they are provisioned.

    :param tpu_slice: the slice, as for the node pool (a TpuSlice, its ``to_dict()``, or
        ``{"accelerator", "topology", "machine_type"?, "num_slices"?}``); one pool (and pod set) per slice of
        ``num_slices``; templated.
    :param node_pool_name: the queued pool(s) of the slice, one per multi-host slice; templated.
    :param node_pool_task_id: instead of ``node_pool_name``: the GKECreateTPUNodePoolOperator task whose
        pools to request nodes for; when they did not end up ``queued`` (a fallback), the task does nothing
        and returns ``{"name": None, ...}``.
    :param max_run_duration_seconds: the request's ``maxRunDurationSeconds``: 1 to 604800 (seven days, GKE's
        limit and default); empty: GKE's default; templated. Checked before anything is created.
    :param name: the ProvisioningRequest's name; default: from the task instance (the same on every try).
    :param wait_timeout: seconds to wait for ``Provisioned=True`` before failing with GKE's last word.

    Kubernetes target, namespace, deferrable and poll_interval as for the KubeRay operators. Returns
    ``{"name", "namespace", "pod_templates", "node_pools", "nodes", "max_run_duration_seconds",
    "annotations", "message"}``; ``annotations`` go on the pods that consume the nodes.
    """

    template_fields: Sequence[str] = (
        *KubernetesBaseOperator.template_fields,
        "tpu_slice",
        "node_pool_name",
        "max_run_duration_seconds",
        "name",
    )

    def __init__(
        self,
        *,
        node_pool_name: str | Sequence[str] | None = None,
        max_run_duration_seconds: int | str | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.node_pool_name = node_pool_name
        self.max_run_duration_seconds = max_run_duration_seconds
        self.name = name
        # What on_kill withdraws, set while this worker waits: (namespace, request, PodTemplates); deferred, the
        # trigger's on_kill does.
        self._owned: tuple[str, str, tuple[str, ...]] | None = None

    def argument_checks(self) -> list[ArgumentCheck]:
        values = (self.tpu_slice, self.node_pool_name, self.node_pool_task_id, self.max_run_duration_seconds, self.name)
        return [*super().argument_checks(), (values, lambda: self.plan(None, "default"))]

    def plan(
        self, identity: TaskIdentity | None, namespace: str, pools: Sequence[str] | None = None
    ) -> ProvisioningRequestPlan:
        """The one check of the request's arguments (UserInputError naming the field), and the objects."""
        from tpuflow.capacity.provisioning_request import plan_provisioning_request, request_name

        if bool(self.node_pool_name) == bool(self.node_pool_task_id):
            raise UserInputError(
                "node_pool_name", self.node_pool_name, "give exactly one of node_pool_name and node_pool_task_id"
            )
        tpu = self.resolved_slice()
        if pools is None:
            explicit = self.node_pool_name
            pools = [explicit] if isinstance(explicit, str) else list(explicit or [])
            if not pools:  # node_pool_task_id: the pools are known once that task ran; check the shape alone
                pools = [f"pool-s{i}" for i in range(tpu.num_slices if tpu.multi_host else 1)]
        who = identity or TaskIdentity("parse", "parse", self.task_id)
        return plan_provisioning_request(
            tpu=tpu,
            node_pools=pools,
            name=self.name or request_name(who),
            namespace=namespace,
            max_run_duration_seconds=self.max_run_duration_seconds,
            labels=kubernetes_ownership_labels(who),
        )

    # --- the flow ---
    def execute(self, context: Context) -> dict[str, Any]:
        self.validate_arguments()  # rendered values, before anything is created
        skipped = self._skip(context, "queued")
        if skipped is not None:
            return skipped
        pools = (
            list(_pool_result(context, self.node_pool_task_id)["node_pool_names"]) if self.node_pool_task_id else None
        )
        identity = TaskIdentity.from_context(context)
        plan = self.plan(identity, self.resolve_namespace(), pools)
        hook = self.kube_hook()
        self._apply(hook, plan, identity.key)
        self.log.info("ProvisioningRequest %s/%s asks for %s", plan.namespace, plan.name, plan.describe())
        started = time.time()
        wait = {
            "name": plan.name,
            "namespace": plan.namespace,
            "deadline": started + float(self.wait_timeout),
            "poll_interval": float(self.poll_interval),
            "started_at": started,
        }
        if self.deferrable:
            self.execute_async(context, wait, plan)
        return self.execute_sync(context, wait, plan)

    def execute_async(self, context: Context, wait: dict[str, Any], plan: ProvisioningRequestPlan) -> None:
        """Defer: ProvisioningRequestTrigger waits for Provisioned=True in the triggerer (its on_kill withdraws)."""
        from tpuflow.capacity.triggers import ProvisioningRequestTrigger

        self.defer(
            trigger=ProvisioningRequestTrigger(target=self.kube_target().to_dict(), plan=plan.describe(), **wait),
            method_name="execute_complete",
        )

    def execute_sync(self, context: Context, wait: dict[str, Any], plan: ProvisioningRequestPlan) -> dict[str, Any]:
        """Wait here: the trigger's own coroutine (wait_provisioned) with asyncio.run."""
        from tpuflow.capacity.hooks import SyncCapacityReader
        from tpuflow.capacity.triggers import wait_provisioned

        self._owned = (plan.namespace, plan.name, plan.template_names)
        try:
            event = asyncio.run(wait_provisioned(SyncCapacityReader(self.kube_hook()), log=self.log, **wait))
        finally:
            self._owned = None
        return self.execute_complete(context, event, plan.describe())

    def execute_complete(self, context: Context, event: Any, plan: Mapping[str, Any] | None = None) -> dict[str, Any]:
        described = dict(plan or (event or {}).get("plan") or {})
        try:
            event = raise_for_event(event, "Waiting for queued TPU capacity")
        except Exception:
            if described.get("name"):
                # Nothing came of it: withdraw the request (and free a queue slot) before failing.
                self.withdraw(described["namespace"], described["name"], tuple(described.get("pod_templates") or ()))
            raise
        return {**described, "message": event.get("message", "")}

    def _apply(self, hook: CapacityHook, plan: ProvisioningRequestPlan, run_key: str) -> None:
        """Create the PodTemplates and the request, or adopt those an earlier try of this task made."""
        from tpuflow.capacity.provisioning_request import request_verdict

        def owner(obj: Mapping[str, Any]) -> str | None:
            return ((obj.get("metadata") or {}).get("labels") or {}).get(RUN_KEY_LABEL)

        existing = hook.get_provisioning_request(plan.name, plan.namespace)
        if existing is not None:
            if owner(existing) != run_key:
                raise AirflowFailException(
                    f"ProvisioningRequest {plan.namespace}/{plan.name} exists and was not created by this task "
                    f"(run-key {owner(existing)}); delete it or give another name"
                )
            want = plan.provisioning_request()["spec"]
            if existing.get("spec") != want:
                raise AirflowFailException(
                    f"ProvisioningRequest {plan.namespace}/{plan.name} exists with spec {existing.get('spec')}, this "
                    f"task wants {want}; a request cannot change: delete it (GKEDeleteProvisioningRequestOperator)"
                )
            verdict = request_verdict(existing)
            if verdict.state != "failed":
                self.log.info("Adopting ProvisioningRequest %s/%s (%s)", plan.namespace, plan.name, verdict.reason)
                return
            self.log.warning(
                "ProvisioningRequest %s/%s ended (%s): asking again", plan.namespace, plan.name, verdict.reason
            )
            self.withdraw(plan.namespace, plan.name, ())
        for template in plan.pod_templates():
            name = template["metadata"]["name"]
            found = hook.get_pod_template(name, plan.namespace)
            if found is None:
                hook.create_pod_template(template, plan.namespace)
            elif owner(found) != run_key:
                raise AirflowFailException(
                    f"PodTemplate {plan.namespace}/{name} exists and was not created by this task; delete it"
                )
        hook.create_provisioning_request(plan.provisioning_request(), plan.namespace)
        self.log.info("Created ProvisioningRequest %s/%s", plan.namespace, plan.name)

    def withdraw(self, namespace: str, name: str, templates: Sequence[str]) -> None:
        """Delete the request and its PodTemplates (its queue slot and any booked nodes go back)."""
        hook = self.kube_hook()
        hook.delete_provisioning_request(name, namespace)
        for template in templates:
            hook.delete_pod_template(template, namespace)

    def on_kill(self) -> None:
        """Killed while waiting in the worker: withdraw the request this task created."""
        if self._owned is not None:
            namespace, name, templates = self._owned
            self.log.warning("Task killed: deleting ProvisioningRequest %s/%s", namespace, name)
            self.withdraw(namespace, name, templates)


class GKEDeleteProvisioningRequestOperator(_CapacityOperator):
    """Delete a ProvisioningRequest and its PodTemplates (the nodes go back); missing ones are success.

    :param name: the request's name; or
    :param created_by_task_id: the GKECreateProvisioningRequestOperator task of this run whose request
        (and the PodTemplates carrying its run-key label) to delete.
    :param keep: templated; true (True, "true", "1", "yes") leaves the request and its PodTemplates (and so
        their nodes) in place, each labelled ``tpuflow-kept=true`` (the orphan reaper leaves them), and returns
        ``{"namespace", "kept": True, "deleted": [], "marked_kept": [...], "absent": [...]}``. Default False.

    Kubernetes target and namespace as for the KubeRay operators. Returns ``{"deleted": [...], "absent": [...]}``.
    """

    template_fields: Sequence[str] = (*KubernetesBaseOperator.template_fields, "name", "keep")

    def __init__(
        self, *, name: str | None = None, created_by_task_id: str | None = None, keep: Any = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.created_by_task_id = created_by_task_id
        self.keep = keep

    def argument_checks(self) -> list[ArgumentCheck]:
        return [*super().argument_checks(), ((self.name, self.created_by_task_id), self._check_target)]

    def _check_target(self) -> None:

        if bool(self.name) == bool(self.created_by_task_id):
            raise UserInputError("name", self.name, "give exactly one of name and created_by_task_id")
        if self.name:
            check_name("name", self.name, max_len=63)

    def request_and_templates(self, context: Context, namespace: str) -> tuple[str, list[str]]:
        """The request's name and its PodTemplates' (those it names, and those carrying its creator's run key)."""
        from tpuflow.capacity.provisioning_request import request_name

        hook = self.kube_hook()
        templates: list[str] = []
        if self.created_by_task_id:
            creator = TaskIdentity.from_context(context, self.created_by_task_id)
            name = request_name(creator)
            templates = hook.pod_template_names(namespace, f"{RUN_KEY_LABEL}={creator.key}")
        else:
            name = str(self.name)
        request = hook.get_provisioning_request(name, namespace)
        for item in (request or {}).get("spec", {}).get("podSets") or []:
            ref = (item.get("podTemplateRef") or {}).get("name")
            if ref and ref not in templates:
                templates.append(ref)
        return name, templates

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate_arguments()
        namespace = self.resolve_namespace()
        hook = self.kube_hook()
        name, templates = self.request_and_templates(context, namespace)
        if is_true(self.keep):
            return self._keep(name, templates, namespace)
        deleted: list[str] = []
        absent: list[str] = []
        for what, gone in [
            (f"provisioningrequest/{name}", hook.delete_provisioning_request(name, namespace)),
            *((f"podtemplate/{t}", hook.delete_pod_template(t, namespace)) for t in templates),
        ]:
            (deleted if gone else absent).append(what)
        self.log.info("Deleted %s; already gone: %s", deleted or "nothing", absent or "nothing")
        return {"namespace": namespace, "deleted": deleted, "absent": absent}

    def _keep(self, name: str, templates: list[str], namespace: str) -> dict[str, Any]:
        """``keep``: leave the request and its PodTemplates, marked kept."""
        hook = self.kube_hook()
        marked: list[str] = []
        absent: list[str] = []
        for what, existed in [
            (f"provisioningrequest/{name}", hook.mark_provisioning_request_kept(name, namespace)),
            *((f"podtemplate/{t}", hook.mark_pod_template_kept(t, namespace)) for t in templates),
        ]:
            (marked if existed else absent).append(what)
        self.log.info("keep: leaving %s (marked kept); already gone: %s", marked or "nothing", absent or "-")
        return {"namespace": namespace, "kept": True, "deleted": [], "marked_kept": marked, "absent": absent}


class GKEWaitForFlexStartCapacityOperator(_CapacityOperator):
    """Wait until GKE's autoscaler grew the flex-start pool(s) for the TPU pods of a RayCluster.

    Runs beside the RayCluster's create task: it reports "waiting for flex-start capacity" with the
    elapsed time while the pods are pending and fails at ``wait_timeout`` with the autoscaler's reason
    (its NotTriggerScaleUp event on the pods, e.g. a stockout).

    :param tpu_slice: the slice, as for the node pool (a TpuSlice, its ``to_dict()``, or
        ``{"accelerator", "topology", "machine_type"?, "num_slices"?}``); templated.
    :param ray_cluster_name: the RayCluster; or
    :param ray_cluster_task_id: the KubeRayCreateClusterOperator task of this run (its deterministic name).
    :param node_pool_task_id: the node pool task; when its pools are not flex-start, nothing to wait for.
    :param wait_timeout: seconds until the task fails with the autoscaler's reason.
    """

    template_fields: Sequence[str] = (
        *KubernetesBaseOperator.template_fields,
        "tpu_slice",
        "ray_cluster_name",
    )

    def __init__(
        self, *, ray_cluster_name: str | None = None, ray_cluster_task_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.ray_cluster_name = ray_cluster_name
        self.ray_cluster_task_id = ray_cluster_task_id

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.ray_cluster_name, self.ray_cluster_task_id), self._check_cluster),
            ((self.tpu_slice,), self.resolved_slice),
        ]

    def _check_cluster(self) -> None:
        if bool(self.ray_cluster_name) == bool(self.ray_cluster_task_id):
            raise UserInputError(
                "ray_cluster_name",
                self.ray_cluster_name,
                "give exactly one of ray_cluster_name and ray_cluster_task_id",
            )

    def execute(self, context: Context) -> dict[str, Any]:

        self.validate_arguments()
        skipped = self._skip(context, "flex-start")
        if skipped is not None:
            return skipped
        tpu = self.resolved_slice()
        namespace = self.resolve_namespace()
        cluster = object_name(context, self.ray_cluster_name, self.ray_cluster_task_id)
        selector = f"ray.io/cluster={cluster},ray.io/node-type=worker"
        started = time.time()
        wait = {
            "namespace": namespace,
            "label_selector": selector,
            "expected_pods": tpu.total_hosts,
            "deadline": started + float(self.wait_timeout),
            "poll_interval": float(self.poll_interval),
            "started_at": started,
        }
        self.log.info(
            "waiting for flex-start capacity: %d TPU host(s) for RayCluster %s/%s", tpu.total_hosts, namespace, cluster
        )
        if self.deferrable:
            self.execute_async(context, wait)
        return self.execute_sync(context, wait)

    def execute_async(self, context: Context, wait: dict[str, Any]) -> None:
        """Defer: FlexStartCapacityTrigger watches the pods in the triggerer."""
        from tpuflow.capacity.triggers import FlexStartCapacityTrigger

        self.defer(
            trigger=FlexStartCapacityTrigger(target=self.kube_target().to_dict(), **wait),
            method_name="execute_complete",
        )

    def execute_sync(self, context: Context, wait: dict[str, Any]) -> dict[str, Any]:
        """Wait here: the trigger's own coroutine (wait_flex_start) with asyncio.run."""
        from tpuflow.capacity.hooks import SyncCapacityReader
        from tpuflow.capacity.triggers import wait_flex_start

        event = asyncio.run(wait_flex_start(SyncCapacityReader(self.kube_hook()), log=self.log, **wait))
        return self.execute_complete(context, event)

    def execute_complete(self, context: Context, event: Any = None) -> dict[str, Any]:
        event = raise_for_event(event, "Waiting for flex-start TPU capacity")
        return {"message": event.get("message", "")}
