"""Airflow operators that create and delete GKE TPU slice node pools.

Cheap to import (DAG files import this): google-cloud, the hooks and the triggers load inside
execute, and the node pool planner (tpuflow.gke.nodepool_spec, with the slice catalog) loads
when a value is first checked: at parse time only when the arguments are static, else in the
worker. Validation happens before any API call and raises UserInputError naming the field.
"""

from __future__ import annotations

import abc
import asyncio
import math
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.docstrings import InheritedParamDocs
from tpuflow.errors import UserInputError
from tpuflow.events import raise_for_event
from tpuflow.gke.links import GKEClusterNodesLink, GKENodePoolLink
from tpuflow.kubernetes.ownership import check_expires_after
from tpuflow.labels import DEFAULT_EXPIRES_AFTER, OWNER_KEY_LABEL
from tpuflow.naming import (
    TaskIdentity,
    check_cluster_location,
    check_cluster_name,
    check_node_pool_name,
    check_project,
)
from tpuflow.templating import is_true
from tpuflow.validation import check_count, check_seconds

# max_run_duration's default: the pool's expires_after, enforced by GKE itself
EXPIRES_AFTER = "expires_after"

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.gke.hooks import ComputeResourcePolicyHook, GKENodePoolHook
    from tpuflow.gke.nodepool_spec import NodePoolPlan
    from tpuflow.gke.provisioning import Progress, RetryPolicy, Sleep, WaitForOperation, _Loop
    from tpuflow.tpu.slice_argument import SliceArgument

ON_KILL_ACTIONS = ("delete", "keep")
# What GKECreateTPUNodePoolOperator.plan() reads: checked together, at parse time when all are static.
PLANNED_FIELDS = (
    "project_id",
    "location",
    "cluster_name",
    "tpu_slice",
    "capacity",
    "fallback_capacity",
    "node_zone",
    "zone_failover",
    "node_pool_name",
    "node_labels",
    "node_taints",
    "service_account",
    "workload_policy",
)


@dataclass(frozen=True)
class PendingWait:
    """A wait the provisioning loop needs before its next step, for the triggerer (execute_async) or this
    worker (execute_sync): a backoff (``Sleep``) or a GKE operation (``WaitForOperation``)."""

    loop: _Loop
    step: Sleep | WaitForOperation
    resume: dict[str, Any]  # what the event hands back: the progress and the operation waited on
    delete_on_kill: dict[str, Any] | None  # what killing the task deletes (the triggers' on_kill)


class _NodePoolOperatorBase(InheritedParamDocs, ArgumentChecks, BaseOperator):
    """Runs a provisioning loop: ``execute`` steps it up to its first wait; ``execute_async`` defers that wait
    to a trigger, ``execute_sync`` runs the trigger's own wait coroutine here; both hand the event to
    ``execute_complete``, which resumes the loop from the event's progress up to the next wait or the end.

    Arguments: one check list (``argument_checks``, tpuflow.arguments), run on static values at parse time
    and on rendered ones at the start of ``execute``. What ``on_kill`` deletes is ``self._owned``, set while
    this worker creates pools and waits on them.

    :param project_id: Google Cloud project ID of the cluster.
    :param location: the cluster's zone (zonal cluster) or region (regional cluster).
    :param cluster_name: the GKE cluster.
    :param gcp_conn_id: Google Cloud connection; its extras may point the GKE API elsewhere
        (``container_api_endpoint``, ``container_api_transport``; see tpuflow.gke.hooks).
    :param impersonation_chain: service account(s) to impersonate, as in the google provider.
    :param deferrable: wait for GKE operations and backoffs in the triggerer, not in a worker slot.
    :param poll_interval: seconds between looks at a running GKE operation.
    :param retry_backoff: first wait (seconds) after GKE reports it is busy; doubles up to ``max_backoff``.
    :param max_backoff: longest wait (seconds) between retries.
    :param max_busy_retries: waits on "too many operations" or transient errors before the task fails.
    :param operation_timeout: seconds a GKE operation on the pool may run (counted from its start) before the
        task stops waiting and fails, naming the operation (default one hour; a TPU pool create takes minutes).
    """

    def __init__(
        self,
        *,
        project_id: str,
        location: str,
        cluster_name: str,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        retry_backoff: float = 30.0,
        max_backoff: float = 600.0,
        max_busy_retries: int = 30,
        operation_timeout: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.location = location
        self.cluster_name = cluster_name
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.retry_backoff = retry_backoff
        self.max_backoff = max_backoff
        self.max_busy_retries = max_busy_retries
        self.operation_timeout = operation_timeout
        # What on_kill cleans up: (hook, the pools this task owns as in _owned_pools), set while the loop runs here.
        self._owned: tuple[GKENodePoolHook, dict[str, Any]] | None = None

    # --- argument checks ---------------------------------------------------------------------------------
    def argument_checks(self) -> list[ArgumentCheck]:
        seconds = ("poll_interval", "retry_backoff", "max_backoff", "operation_timeout")
        return [
            *super().argument_checks(),
            *(((getattr(self, f),), lambda f=f: check_seconds(f, getattr(self, f))) for f in seconds),
            ((self.max_busy_retries,), lambda: check_count("max_busy_retries", self.max_busy_retries, minimum=0)),
        ]

    def cluster_name_checks(self) -> list[ArgumentCheck]:
        """The cluster's coordinates, each on its own: a static one is checked at parse time whatever the others."""
        return [
            ((self.project_id,), lambda: check_project(self.project_id)),
            ((self.location,), lambda: check_cluster_location(self.location)),
            ((self.cluster_name,), lambda: check_cluster_name(self.cluster_name)),
        ]

    # --- shared plumbing -------------------------------------------------------------------------------
    def _policy(self, **extra: Any) -> RetryPolicy:
        from tpuflow.gke.provisioning import RetryPolicy

        return RetryPolicy(
            poll_interval=float(self.poll_interval),
            backoff=float(self.retry_backoff),
            max_backoff=float(self.max_backoff),
            max_busy_retries=int(self.max_busy_retries),
            operation_timeout=float(self.operation_timeout),
            **extra,
        )

    def get_hook(self, location: str) -> GKENodePoolHook:
        from tpuflow.gke.hooks import GKENodePoolHook

        return GKENodePoolHook(
            gcp_conn_id=self.gcp_conn_id, location=location, impersonation_chain=self.impersonation_chain
        )

    def get_compute_hook(self) -> ComputeResourcePolicyHook:
        """Compute resource policies (the workload policies of multi-host tpu7x pools)."""
        from tpuflow.gke.hooks import ComputeResourcePolicyHook

        return ComputeResourcePolicyHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)

    @abc.abstractmethod
    def _loop(self, context: Context, progress: Progress) -> _Loop: ...

    def _owned_pools(self, loop: _Loop) -> dict[str, Any] | None:
        """The pools this task owns (see triggers.delete_owned_node_pools); None: it owns none."""
        return None

    def _delete_on_kill(self, owned: dict[str, Any] | None) -> dict[str, Any] | None:
        """What killing the task deletes; None: nothing."""
        return owned

    # --- the skeleton: execute -> execute_sync | execute_async -> execute_complete --------------------------
    def run_loop(self, context: Context, progress: Progress) -> Any:
        """The rest of ``execute``: step the loop up to its first wait, then wait in the triggerer
        (``advance`` defers) or in this worker (``execute_sync``)."""
        try:
            outcome = self.advance(context, progress)
            return self.execute_sync(context, outcome) if isinstance(outcome, PendingWait) else outcome
        finally:
            self._owned = None

    def advance(self, context: Context, progress: Progress, waiting: dict[str, Any] | None = None) -> Any:
        """Step the loop (``waiting``: the operation the last wait was on): the result once done; else defer the
        next wait (deferrable) or return it (a PendingWait) for execute_sync to run here."""
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from tpuflow.gke.provisioning import Done, NodePoolFailed, WaitForOperation

        loop = self._loop(context, progress)
        owned = self._owned_pools(loop)
        self._owned = (loop.hook, owned) if owned else None  # the step may create pools: on_kill deletes them
        try:
            finished = None
            if waiting is not None:
                wait = WaitForOperation(**waiting)
                finished = (wait, loop.hook.get_operation(wait.operation, project_id=loop.project_id))
            step = loop.step(progress, finished)
        except NodePoolFailed as err:
            # Fail at once (no Airflow retries) unless a later try could succeed, e.g. capacity returns.
            raise (AirflowException if err.retryable else AirflowFailException)(str(err)) from err
        if isinstance(step, Done):
            self._owned = None
            return step.result
        resume = {
            "progress": progress.to_dict(),
            "waiting": step.to_dict() if isinstance(step, WaitForOperation) else None,
        }
        pending = PendingWait(loop, step, resume, self._delete_on_kill(owned))
        if self.deferrable:
            self.execute_async(context, pending)
        return pending

    def execute_async(self, context: Context, pending: PendingWait) -> None:
        """Defer the wait: NodePoolBackoffTrigger (a backoff) or GKENodePoolOperationTrigger (an operation)."""
        from tpuflow.gke.provisioning import Sleep
        from tpuflow.gke.triggers import GKENodePoolOperationTrigger, NodePoolBackoffTrigger

        step, loop = pending.step, pending.loop
        trigger: Any
        if isinstance(step, Sleep):
            self.log.info("Deferring for %.1f s: %s", step.seconds, step.reason)
            trigger = NodePoolBackoffTrigger(
                wake_at=time.time() + step.seconds,
                reason=step.reason,
                resume=pending.resume,
                delete_on_kill=pending.delete_on_kill,
            )
        else:
            self.log.info("Deferring until operation %s (%s %s) is done", step.operation, step.action, step.pool)
            trigger = GKENodePoolOperationTrigger(
                operation_name=step.operation,
                project_id=loop.project_id,
                location=loop.hook.location or "",
                gcp_conn_id=self.gcp_conn_id,
                impersonation_chain=self.impersonation_chain,
                poll_interval=self.poll_interval,
                resume=pending.resume,
                delete_on_kill=pending.delete_on_kill,
                operation_timeout=float(self.operation_timeout),
            )
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_sync(self, context: Context, pending: PendingWait) -> Any:
        """Wait here, wait after wait: each the triggers' own coroutine (tpuflow.gke.waits) run with asyncio.run,
        its event (with the progress) resumed by execute_complete, until the loop is done. A loop, not a
        recursion: a long run of backoffs must not grow the stack."""
        outcome: Any = pending
        while isinstance(outcome, PendingWait):
            event = asyncio.run(self._wait_here(outcome))
            outcome = self.execute_complete(context, {**event, "resume": outcome.resume})
        return outcome

    def _wait_here(self, pending: PendingWait) -> Coroutine[Any, Any, dict[str, Any]]:
        from tpuflow.gke.provisioning import Sleep
        from tpuflow.gke.waits import wait_for_operation, wait_until

        step, loop = pending.step, pending.loop
        if isinstance(step, Sleep):
            self.log.info("Waiting %.1f s: %s", step.seconds, step.reason)
            return wait_until(time.time() + step.seconds, step.reason)

        async def get_operation(name: str = step.operation) -> Any:
            return loop.hook.get_operation(name, project_id=loop.project_id)

        return wait_for_operation(
            get_operation,
            step.operation,
            poll_interval=float(self.poll_interval),
            log=self.log,
            timeout=float(self.operation_timeout),
        )

    def execute_complete(self, context: Context, event: Any = None) -> Any:
        """A wait's event (from the trigger, or from execute_sync): resume the loop from its progress."""
        event = raise_for_event(event, f"Task {self.task_id} waiting on GKE")
        from airflow.sdk.exceptions import AirflowException

        from tpuflow.gke.provisioning import Progress

        resume = event.get("resume")
        if not isinstance(resume, Mapping):
            raise AirflowException(f"Trigger event {dict(event)!r} carries no progress; clear the task to start over")
        return self.advance(context, Progress.from_dict(resume.get("progress")), resume.get("waiting"))


class GKECreateTPUNodePoolOperator(_NodePoolOperatorBase):
    """Create the GKE node pool(s) for a TPU slice, or adopt the ones an earlier try created.

    The slice (``tpu_slice``) comes from the catalog: machine type, node count (hosts; one pool per
    multi-host slice, since GKE cannot grow a multi-host pool), COMPACT placement with the topology for
    multi-host slices, a workload policy for multi-host tpu7x, none for single-host slices.

    Static arguments are checked when the DAG file is parsed (a bad one is an import error);
    templated ones when the task starts, before any API call.

    :param tpu_slice: the slice (tpuflow.tpu.slice_argument): a TpuSlice (``TpuSlice.from_spec("v6e", "4x4")``),
        its ``to_dict()``, or ``{"accelerator", "topology", "machine_type"?, "num_slices"?}`` whose values may be
        templates. ``accelerator`` in any of its names (``v6e``, ``TPU-V6E``, ``tpu-v6e-slice``); ``topology`` the
        shape, e.g. ``4x4`` or ``2x2x2`` (not a chip count); ``machine_type`` only to pick among machine types of
        one shape; ``num_slices`` identical slices (multislice), each multi-host slice in its own pool. Templated.
    :param capacity: ``on-demand``, ``spot``, ``reservation:NAME``, ``flex-start`` or ``queued``.
    :param fallback_capacity: capacities to try in order when GKE reports a stockout, e.g.
        ``["on-demand"]`` after ``capacity="spot"``. After the last one, the create is retried
        ``stockout_retries`` times with backoff, then the task fails (an Airflow retry adopts or
        starts over).
    :param node_zone: the zone of the slice when ``location`` is a region (regional cluster); or several zones
        of that region (a list, or comma-separated), tried in order on a stockout or a quota error: every slice
        of the task lands in the one zone that had room, named in the result's ``node_zone``.
    :param zone_failover: with several zones, ``"zone-first"`` (default: every zone with the first capacity, then
        the next capacity) or ``"capacity-first"`` (every capacity in the first zone, then the next zone).
    :param node_pool_name: default: derived from dag id, run id, task id and map index, so a retry
        adopts the pool its earlier try made; a pool of that name with another spec is an error.
    :param node_labels: Kubernetes labels for the nodes (tpuflow.labels rules; not under GKE's own
        prefixes such as ``cloud.google.com/``).
    :param node_taints: taints as ``KEY=VALUE:EFFECT`` strings or ``{key, value, effect}`` dicts.
    :param service_account: the nodes' service account email (default: the cluster's).
    :param workload_policy: name of a HIGH_THROUGHPUT workload policy (multi-host tpu7x only). Unset for
        multi-host tpu7x: the task makes one for the topology through the Compute API (named from the task
        instance; an identical one of that name is adopted, a different one is an error) and the delete
        operator removes it after the pools (tpuflow.gke.workload_policy). A given one is never deleted.
    :param expires_after: recorded on the VMs as the ``tpuflow-expires`` label (unix time), with
        ``tpuflow-dag/-run/-task/-key`` labels, so an orphaned pool can be found and removed; None: no expiry
        label (the reaper judges the pool by its run alone). Templated.
    :param max_run_duration: GKE's ``NodeConfig.maxRunDuration``: GKE deletes each node this long after it
        started, so the slice stops billing even when Airflow, its triggerer and the reaper are all down.
        ``"expires_after"`` (default): the same span as ``expires_after``; seconds or a timedelta; None or
        ``""``: no limit (e.g. a pool meant to outlive its run). Flex-start and queued pools are capped at
        GKE's seven days. Templated.
    :param stockout_retries: extra tries of the last capacity choice after a stockout.
    :param on_kill_action: what killing the task (marking it failed or success, clearing it) does
        with the pools it created: ``"delete"`` (default; in a worker and while deferred, waiting
        out a create still running) or ``"keep"`` (leave them, e.g. to debug a slice; they stay
        billed until a delete task or ``gcloud container node-pools delete`` removes them).
        A failure inside the task always deletes what the task created.

    Pushes XCom ``node_pool_name``, ``node_pool_names`` and returns a dict describing the pools.
    """

    template_fields: Sequence[str] = (
        *PLANNED_FIELDS,
        "expires_after",
        "max_run_duration",
        "gcp_conn_id",
        "impersonation_chain",
    )
    operator_extra_links = (GKENodePoolLink(), GKEClusterNodesLink())
    ui_color = "#d5e8ff"

    def __init__(
        self,
        *,
        tpu_slice: SliceArgument,
        capacity: str = "on-demand",
        fallback_capacity: Sequence[str] | str = (),
        node_zone: str | Sequence[str] | None = None,
        zone_failover: str = "zone-first",
        node_pool_name: str | None = None,
        node_labels: Mapping[str, str] | None = None,
        node_taints: Sequence[Any] | str | None = None,
        service_account: str | None = None,
        workload_policy: str | None = None,
        expires_after: timedelta | float | str | None = DEFAULT_EXPIRES_AFTER,
        max_run_duration: timedelta | float | str | None = EXPIRES_AFTER,
        stockout_retries: int = 2,
        on_kill_action: str = "delete",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tpu_slice = tpu_slice
        self.capacity = capacity
        self.fallback_capacity = fallback_capacity
        self.node_zone = node_zone
        self.zone_failover = zone_failover
        self.node_pool_name = node_pool_name
        self.node_labels = node_labels
        self.node_taints = node_taints
        self.service_account = service_account
        self.workload_policy = workload_policy
        self.expires_after = expires_after
        self.max_run_duration = max_run_duration
        self.stockout_retries = stockout_retries
        self.on_kill_action = on_kill_action

    def argument_checks(self) -> list[ArgumentCheck]:
        # The names the plan reads are also checked one by one: with the slice templated (the plan waits for
        # execute) a bad static name still fails the DAG import, not this task after an earlier one made a pool.
        planned = tuple(getattr(self, field) for field in PLANNED_FIELDS)
        return [
            ((self.on_kill_action,), self._check_on_kill_action),
            ((self.expires_after,), self._expires_in),
            ((self.max_run_duration, self.expires_after), self._max_run_s),
            ((self.stockout_retries,), lambda: check_count("stockout_retries", self.stockout_retries, minimum=0)),
            *super().argument_checks(),
            *self.cluster_name_checks(),
            ((self.node_pool_name,), lambda: not self.node_pool_name or check_node_pool_name(self.node_pool_name)),
            (planned, lambda: self.plan(TaskIdentity("parse", "parse", self.task_id), None)),
        ]

    def _check_on_kill_action(self) -> None:
        if self.on_kill_action not in ON_KILL_ACTIONS:
            raise UserInputError("on_kill_action", self.on_kill_action, "use 'delete' (the default) or 'keep'")

    def _expires_in(self) -> float | None:
        return check_expires_after(self.expires_after)

    def _max_run_s(self) -> int | None:
        """The (rendered) max_run_duration as whole seconds (rounded up); None: no limit."""
        value = self.max_run_duration
        if value == EXPIRES_AFTER:
            value = self._expires_in()
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise UserInputError(
                    "max_run_duration", value, "give seconds, a timedelta, 'expires_after' or None"
                ) from None
        return math.ceil(check_seconds("max_run_duration", value) or 0)

    def plan(self, identity: TaskIdentity, expires_at: int | None) -> NodePoolPlan:
        """The pools this task instance makes: the one check of every planned argument (UserInputError)."""
        from tpuflow.gke.nodepool_spec import plan_node_pools

        return plan_node_pools(
            project_id=self.project_id,
            location=self.location,
            cluster_name=self.cluster_name,
            tpu_slice=self.tpu_slice,
            capacity=self.capacity,
            fallback_capacity=self.fallback_capacity,
            node_zone=self.node_zone or None,
            zone_failover=self.zone_failover,
            node_pool_name=self.node_pool_name or None,
            node_labels=self.node_labels,
            node_taints=self.node_taints,
            service_account=self.service_account,
            workload_policy=self.workload_policy,
            identity=identity,
            expires_at=expires_at,
            max_run_duration_s=self._max_run_s(),
        )

    def _loop(self, context: Context, progress: Progress) -> _Loop:
        from tpuflow.gke.provisioning import NodePoolProvisioner

        plan = self.plan(TaskIdentity.from_context(context), progress.expires_at)
        policy = self._policy(stockout_retries=self.stockout_retries)
        if plan.made_workload_policy is not None:
            from tpuflow.gke.policy_provisioning import WorkloadPolicyFirstProvisioner

            return WorkloadPolicyFirstProvisioner(self.get_hook(plan.location), plan, policy, self.get_compute_hook())
        return NodePoolProvisioner(self.get_hook(plan.location), plan, policy)

    def _owned_pools(self, loop: _Loop) -> dict[str, Any] | None:

        plan = loop.plan  # type: ignore[attr-defined]
        chain = self.impersonation_chain
        return {
            "project_id": plan.project_id,
            "location": plan.location,
            "cluster_name": plan.cluster_name,
            "node_pool_names": list(plan.names),
            "owner_key": plan.resource_labels.get(OWNER_KEY_LABEL),
            "gcp_conn_id": self.gcp_conn_id,
            "impersonation_chain": list(chain) if isinstance(chain, (list, tuple)) else chain,
            "poll_interval": float(self.poll_interval),
        }

    def _delete_on_kill(self, owned: dict[str, Any] | None) -> dict[str, Any] | None:
        return owned if self.on_kill_action == "delete" else None

    def on_kill(self) -> None:
        """Killed while running in the worker (not deferred): delete the node pools this task owns
        (``on_kill_action="delete"``), or say which ones are left (``"keep"``).

        Runs in the SIGTERM handler with a few seconds before SIGKILL, so it cannot wait for a create
        still running on a pool (GKE refuses the delete until then); those pools are named in the log.
        A deferred task is handled by its trigger's on_kill, which does wait.
        """
        if self._owned is None:
            return
        hook, owned = self._owned
        where = f"--cluster={owned['cluster_name']} --location={owned['location']} --project={owned['project_id']}"
        if self.on_kill_action == "keep":
            self.log.warning(
                "Task killed; on_kill_action='keep' leaves node pool(s) %s running (and billed): delete them with "
                "`gcloud container node-pools delete NAME %s`",
                ", ".join(owned["node_pool_names"]),
                where,
            )
            return
        from tpuflow.gke.provisioning import kill_owned_pools

        for name in kill_owned_pools(hook, owned):
            self.log.error(
                "Task killed while GKE is still creating node pool %s, which cannot be deleted before that ends: "
                "delete it with `gcloud container node-pools delete %s %s`",
                name,
                name,
                where,
            )

    def execute(self, context: Context) -> Any:
        from tpuflow.gke.provisioning import Progress

        self.validate_arguments()  # the rendered values, before any API call
        expires_in = self._expires_in()
        progress = Progress(expires_at=None if expires_in is None else int(time.time() + expires_in))
        plan = self.plan(TaskIdentity.from_context(context), progress.expires_at)
        where = {"project_id": plan.project_id, "location": plan.location, "cluster_name": plan.cluster_name}
        GKENodePoolLink.persist(context, node_pool_name=plan.names[0], **where)
        GKEClusterNodesLink.persist(context, **where)
        context["ti"].xcom_push(key="node_pool_name", value=plan.names[0])
        context["ti"].xcom_push(key="node_pool_names", value=list(plan.names))
        self.log.info("Node pool plan: %s", plan.describe())
        return self.run_loop(context, progress)


class GKEDeleteNodePoolOperator(_NodePoolOperatorBase):
    """Delete node pools and wait until they are gone; a missing pool is success. Use as a teardown.

    Name the pools with ``node_pool_name``, or with ``created_by_task_id``: every pool in the cluster
    whose ``tpuflow-key`` label says that task of this DAG run (same map index) created it. Static
    arguments are checked when the DAG file is parsed, templated ones when the task starts.

    :param node_pool_name: a pool name or a list of them, e.g. the create task's ``node_pool_names`` XCom.
    :param created_by_task_id: the create task whose pools to delete (instead of ``node_pool_name``).
    :param keep: templated; true (True, "true", "1", "yes") leaves the pools in place instead, their GCE
        resourceLabels given ``tpuflow-kept=true`` and rid of ``tpuflow-expires`` (GKE nodePools.update, waited
        for as deletes are: in the worker, or deferred), so the orphan reaper leaves them (their workload
        policies too); returns ``{"kept": True, "deleted": [], "marked_kept": [...], "absent": [...]}`` with the
        cluster's coordinates. Default False.

    After the pools, the workload policies the create task made for them are deleted (never a policy the
    user gave: only one whose description names the pools' ``tpuflow-key``).

    Returns ``{"deleted": [...], "absent": [...]}`` with the cluster's coordinates.
    """

    template_fields: Sequence[str] = (
        "project_id",
        "location",
        "cluster_name",
        "node_pool_name",
        "created_by_task_id",
        "gcp_conn_id",
        "impersonation_chain",
        "keep",
    )
    operator_extra_links = (GKEClusterNodesLink(),)
    ui_color = "#ffd9d5"

    def __init__(
        self,
        *,
        node_pool_name: str | Sequence[str] | None = None,
        created_by_task_id: str | None = None,
        keep: Any = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.node_pool_name = node_pool_name
        self.created_by_task_id = created_by_task_id
        self.keep = keep

    def _names(self, context: Context, hook: GKENodePoolHook) -> list[str]:

        if self.created_by_task_id:
            key = TaskIdentity.from_context(context, self.created_by_task_id).key
            pools = hook.list_node_pools(project_id=self.project_id, cluster_name=self.cluster_name)
            return [p.name for p in pools if p.config.resource_labels.get(OWNER_KEY_LABEL) == key]
        return self._given_names()

    def _given_names(self) -> list[str]:
        value = self.node_pool_name
        return [value] if isinstance(value, str) else list(value or [])

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            *self.cluster_name_checks(),
            ((self.node_pool_name, self.created_by_task_id), self._check_pools),
        ]

    def _check_pools(self) -> None:
        if bool(self.node_pool_name) == bool(self.created_by_task_id):
            raise UserInputError(
                "node_pool_name", self.node_pool_name, "give exactly one of node_pool_name and created_by_task_id"
            )
        for name in self._given_names():
            check_node_pool_name(name)

    def _loop(self, context: Context, progress: Progress) -> _Loop:
        from tpuflow.gke.policy_provisioning import NodePoolThenPolicyRemover, policies_to_delete

        hook = self.get_hook(self.location)
        if is_true(self.keep):
            from tpuflow.gke.provisioning import NodePoolKeeper

            if progress.pools is None:  # resolved once, as the delete does
                progress.pools = self._names(context, hook)
            return NodePoolKeeper(hook, self.project_id, self.cluster_name, progress.pools, self._policy())
        if progress.pools is None:
            # Resolved once: a resumed task keeps deleting the same pools (then the workload policies made for them).
            progress.pools = self._names(context, hook)
            creator = TaskIdentity.from_context(context, self.created_by_task_id) if self.created_by_task_id else None
            progress.workload_policy["policies"] = policies_to_delete(
                hook,
                project_id=self.project_id,
                cluster_name=self.cluster_name,
                location=self.location,
                names=progress.pools,
                created_by=creator,
            )
        return NodePoolThenPolicyRemover(
            hook, self.project_id, self.cluster_name, progress.pools, self._policy(), self.get_compute_hook()
        )

    def execute(self, context: Context) -> Any:
        from tpuflow.gke.provisioning import Progress

        self.validate_arguments()
        GKEClusterNodesLink.persist(
            context, project_id=self.project_id, location=self.location, cluster_name=self.cluster_name
        )
        if is_true(self.keep):
            which = self.created_by_task_id or self.node_pool_name
            self.log.info("keep: leaving the node pools of %s in place, marked kept", which)
        return self.run_loop(context, Progress())
