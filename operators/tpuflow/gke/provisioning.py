"""The decision loop behind the node pool operators: look at what exists, take one step, repeat.

Each call to ``step`` reads the pools, then returns what to do next: wait for an operation, sleep
(backoff), or done. The operators run it either in the worker (polling) or across deferrals; all
state between steps is a plain-JSON ``Progress``, so a resumed or retried task continues where it
was. Nothing is remembered outside GKE: a retry of the task finds its pools by their deterministic
names, adopts matching ones and waits for operations still running.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from google.api_core.exceptions import GoogleAPICallError

from tpuflow.gke.errors import FailureKind, GKEFailure, classify_exception, classify_operation, explain
from tpuflow.gke.hooks import GKENodePoolHook, to_rest_json
from tpuflow.gke.nodepool_spec import NodePoolPlan, match_choice
from tpuflow.labels import EXPIRES_LABEL, OWNER_KEY_LABEL, is_kept, kept_labels

log = logging.getLogger(__name__)

_BUSY_STATES = ("PROVISIONING", "RECONCILING", "STOPPING")
_BROKEN_STATES = ("ERROR", "RUNNING_WITH_ERROR")


class NodePoolFailed(Exception):
    """Provisioning cannot succeed. ``retryable``: an Airflow retry might (capacity may come back)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class RetryPolicy:
    poll_interval: float = 10.0
    backoff: float = 30.0
    max_backoff: float = 600.0
    stockout_retries: int = 2  # extra tries of the last capacity choice after a stockout
    max_busy_retries: int = 30  # waits on "too many operations" / transient errors
    operation_timeout: float | None = None  # seconds an operation may run before its wait gives up

    def delay(self, attempt: int) -> float:
        return float(min(self.backoff * 2 ** max(attempt - 1, 0), self.max_backoff))


@dataclass
class Progress:
    choice: int = 0  # index into plan.choices: (zone, capacity) in the order to try them
    last_choice_stockouts: int = 0
    busy_retries: int = 0
    delay_next_create: float = 0.0
    tried: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    capacity_of: dict[str, str] = field(default_factory=dict)
    zone_of: dict[str, str] = field(default_factory=dict)
    pools: list[str] | None = None  # the delete operator's resolved pool names
    failure: str | None = None  # set: delete what we made, then raise this
    failure_retryable: bool = False
    expires_at: int | None = None
    workload_policy: dict[str, Any] = field(default_factory=dict)  # tpuflow.gke.policy_provisioning's state
    labelled: list[str] = field(default_factory=list)  # NodePoolKeeper: pools whose kept-label update is done

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Progress:
        return cls(**(data or {}))


@dataclass(frozen=True)
class WaitForOperation:
    operation: str
    action: str  # create | delete | label
    pool: str
    choice: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sleep:
    seconds: float
    reason: str


@dataclass(frozen=True)
class Done:
    result: dict[str, Any]


Step = WaitForOperation | Sleep | Done


class _Loop(abc.ABC):
    def __init__(self, hook: GKENodePoolHook, project_id: str, cluster_name: str, policy: RetryPolicy) -> None:
        self.hook = hook
        self.project_id = project_id
        self.cluster_name = cluster_name
        self.policy = policy

    def _explain(self, failure: GKEFailure, action: str, what: str, **extra: Any) -> str:
        return explain(
            failure,
            action=action,
            what=what,
            project_id=self.project_id,
            location=self.hook.location or "",
            cluster_name=self.cluster_name,
            **extra,
        )

    def _busy(self, progress: Progress, failure: GKEFailure, action: str, what: str) -> Sleep:
        progress.busy_retries += 1
        if progress.busy_retries > self.policy.max_busy_retries:
            raise NodePoolFailed(self._explain(failure, action, what), retryable=True)
        delay = self.policy.delay(progress.busy_retries)
        log.warning("GKE is busy (%s); retrying in %.1f s", failure.message, delay)
        return Sleep(delay, f"{failure.kind.value}: {failure.message}")

    def _pool_call_failed(
        self, progress: Progress, exc: GoogleAPICallError, action: str, name: str, explain: Callable[[str], str]
    ) -> Step | None:
        """A pool call GKE refused: None for a pool that is gone, a backoff when GKE is busy, else
        NodePoolFailed (not retryable) with ``explain`` of GKE's reason."""
        failure = classify_exception(exc)
        if failure.kind is FailureKind.NOT_FOUND:
            return None
        if failure.kind.wait_and_retry:
            return self._busy(progress, failure, action, f"node pool {name}")
        raise NodePoolFailed(explain(self._explain(failure, action, f"node pool {name}")), retryable=False) from exc

    def _delete(self, progress: Progress, name: str) -> Step | None:
        """Start deleting one pool; None when there is nothing to wait for (look again)."""
        try:
            operation = self.hook.delete_node_pool(
                project_id=self.project_id, cluster_name=self.cluster_name, node_pool_name=name
            )
        except GoogleAPICallError as exc:
            return self._pool_call_failed(progress, exc, "delete", name, str)
        if operation is None:
            return None
        return WaitForOperation(operation.name, "delete", name)

    def _absorb_delete(self, progress: Progress, wait: WaitForOperation, failure: GKEFailure | None) -> None:
        if failure is None or failure.kind is FailureKind.NOT_FOUND:
            progress.deleted.append(wait.pool)
            return
        if failure.kind.wait_and_retry:
            progress.busy_retries += 1
            return
        raise NodePoolFailed(
            f"Deleting node pool {wait.pool} failed and it may still exist (and cost money): delete it with "
            f"`gcloud container node-pools delete {wait.pool} --cluster={self.cluster_name} "
            f"--location={self.hook.location} --project={self.project_id}`. "
            + self._explain(failure, "delete", f"node pool {wait.pool}"),
            retryable=True,
        )

    def _get(self, name: str) -> dict[str, Any] | None:
        pool = self.hook.get_node_pool(project_id=self.project_id, cluster_name=self.cluster_name, node_pool_name=name)
        return None if pool is None else to_rest_json(pool)

    def _wait_on_busy_pool(self, name: str, status: str, choice: int | None) -> Step:
        operation = self.hook.find_running_operation(
            project_id=self.project_id, cluster_name=self.cluster_name, node_pool_name=name
        )
        if operation is None:
            return Sleep(self.policy.poll_interval, f"node pool {name} is {status}")
        action = "delete" if status == "STOPPING" or "DELETE" in operation.operation_type.name else "create"
        return WaitForOperation(operation.name, action, name, choice)

    def step(self, progress: Progress, finished: tuple[WaitForOperation, Any] | None = None) -> Step:
        if finished is not None:
            wait, operation = finished
            self._absorb(progress, wait, classify_operation(to_rest_json(operation)))
        while True:
            outcome = self._pass(progress)
            if outcome is not None:
                return outcome

    @abc.abstractmethod
    def _absorb(self, progress: Progress, wait: WaitForOperation, failure: GKEFailure | None) -> None: ...

    @abc.abstractmethod
    def _pass(self, progress: Progress) -> Step | None: ...


class NodePoolProvisioner(_Loop):
    """Bring the plan's node pools to RUNNING, falling back through the capacity choices."""

    def __init__(self, hook: GKENodePoolHook, plan: NodePoolPlan, policy: RetryPolicy) -> None:
        super().__init__(hook, plan.project_id, plan.cluster_name, policy)
        self.plan = plan
        tpu = plan.tpu
        slices = f" x {tpu.num_slices}" if tpu.num_slices > 1 else ""
        self.what = f"a {tpu.generation.name} {tpu.topology} slice{slices} ({tpu.machine_type})"

    def _fail(self, failure: GKEFailure, action: str = "create", **extra: Any) -> str:
        return self._explain(
            failure, action, self.what, zone=", ".join(self.plan.zones) or self.plan.node_zone, **extra
        )

    def _choice_text(self, choice: int) -> str:
        zone, capacity = self.plan.choices[choice]
        return f"{capacity} in {zone}" if len(self.plan.zones) > 1 else str(capacity)

    def _owned(self, progress: Progress, name: str, pool: dict[str, Any]) -> bool:
        if name in progress.created:
            return True
        ours = self.plan.resource_labels.get(OWNER_KEY_LABEL)
        theirs = ((pool.get("config") or {}).get("resourceLabels") or {}).get(OWNER_KEY_LABEL)
        return bool(ours) and ours == theirs

    def _mismatch(self, name: str, diffs: list[str]) -> NodePoolFailed:
        return NodePoolFailed(
            f"Node pool {name} already exists in cluster {self.cluster_name} but is not {self.what} with capacity "
            f"{' or '.join(self._choice_text(i) for i in range(len(self.plan.choices)))}: {'; '.join(diffs)}. It was "
            "not reused. Delete it (if it is stale) or give this task another node_pool_name.",
            retryable=False,
        )

    def _next_zone(self, choice: int) -> int | None:
        """The first later choice in another zone (a quota is regional or zonal: another capacity in the same
        zone draws on the same one)."""
        zone = self.plan.choices[choice][0]
        return next((i for i in range(choice + 1, len(self.plan.choices)) if self.plan.choices[i][0] != zone), None)

    def _quota(self, progress: Progress, choice: int | None, failure: GKEFailure) -> bool:
        """A quota error: move on to the next zone if there is one (True), else it fails the task."""
        choice = progress.choice if choice is None else choice
        following = self._next_zone(choice)
        if following is None:
            return False
        progress.tried.append(self._choice_text(choice))
        if choice >= progress.choice:
            log.warning(
                "Quota too small in %s (%s); trying %s",
                self.plan.choices[choice][0],
                failure.message,
                self._choice_text(following),
            )
            progress.choice = following
        return True

    def _stockout(self, progress: Progress, choice: int | None, failure: GKEFailure) -> None:
        choice = progress.choice if choice is None else choice
        progress.tried.append(self._choice_text(choice))
        if choice < progress.choice:
            return  # an older attempt; we already moved on
        if progress.choice + 1 < len(self.plan.choices):
            progress.choice += 1
            log.warning(
                "No %s capacity (%s); falling back to %s",
                self._choice_text(choice),
                failure.message,
                self._choice_text(progress.choice),
            )
            return
        progress.last_choice_stockouts += 1
        if progress.last_choice_stockouts > self.policy.stockout_retries:
            progress.failure = self._fail(failure, tried=progress.tried)
            progress.failure_retryable = True
        else:
            progress.delay_next_create = self.policy.delay(progress.last_choice_stockouts)
            log.warning("No capacity (%s); trying again in %.0f s", failure.message, progress.delay_next_create)

    def _absorb(self, progress: Progress, wait: WaitForOperation, failure: GKEFailure | None) -> None:
        if wait.action == "delete":
            self._absorb_delete(progress, wait, failure)
            return
        if failure is None:
            return
        # A failed create usually leaves the pool in ERROR; the next pass deletes it.
        log.warning("Creating node pool %s failed: %s", wait.pool, failure)
        if failure.kind is FailureKind.STOCKOUT:
            self._stockout(progress, wait.choice, failure)
        elif failure.kind is FailureKind.QUOTA and self._quota(progress, wait.choice, failure):
            return
        elif failure.kind.wait_and_retry:
            progress.busy_retries += 1
            progress.delay_next_create = self.policy.delay(progress.busy_retries)
        else:
            progress.failure = self._fail(failure)
            progress.failure_retryable = False

    def _create(self, progress: Progress, index: int) -> Step | None:
        if progress.delay_next_create > 0:
            delay, progress.delay_next_create = progress.delay_next_create, 0.0
            return Sleep(delay, "backing off before the next create")
        name = self.plan.names[index]
        zone, capacity = self.plan.choices[progress.choice]
        try:
            operation = self.hook.create_node_pool(
                project_id=self.project_id,
                cluster_name=self.cluster_name,
                node_pool=self.plan.body(index, capacity, zone),
            )
        except GoogleAPICallError as exc:
            failure = classify_exception(exc)
            if failure.kind is FailureKind.ALREADY_EXISTS:
                # Created between our read and our create (e.g. a parallel try): look again, bounded.
                progress.busy_retries += 1
                if progress.busy_retries > self.policy.max_busy_retries:
                    raise NodePoolFailed(self._fail(failure), retryable=True) from exc
                return None
            if failure.kind is FailureKind.STOCKOUT:
                self._stockout(progress, progress.choice, failure)
                return None
            if failure.kind is FailureKind.QUOTA and self._quota(progress, progress.choice, failure):
                return None
            if failure.kind.wait_and_retry:
                return self._busy(progress, failure, "create", self.what)
            # Quota (no other zone left to try), permission, invalid argument, missing cluster: retrying will not help.
            raise NodePoolFailed(self._fail(failure), retryable=False) from exc
        progress.created.append(name)
        progress.capacity_of[name] = str(capacity)
        progress.zone_of[name] = zone
        log.info("Creating node pool %s (%s, %s in %s): operation %s", name, self.what, capacity, zone, operation.name)
        return WaitForOperation(operation.name, "create", name, progress.choice)

    def _pass(self, progress: Progress) -> Step | None:
        cleaning = progress.failure is not None
        for index, name in enumerate(self.plan.names):
            pool = self._get(name)
            if pool is None:
                if cleaning:
                    continue
                return self._create(progress, index)
            status = pool.get("status", "")
            if cleaning:
                if not self._owned(progress, name, pool):
                    continue
                if status in _BUSY_STATES:
                    return self._wait_on_busy_pool(name, status, None)
                return self._delete(progress, name)
            if status in _BROKEN_STATES:
                if not self._owned(progress, name, pool):
                    raise self._mismatch(name, [f"it is in state {status} and was not created by this task"])
                log.warning("Node pool %s is %s (%s); deleting it", name, status, pool.get("statusMessage", ""))
                return self._delete(progress, name)
            choice = None
            if status != "STOPPING":
                choice, diffs = match_choice(self.plan, index, pool)
                if choice is None:
                    raise self._mismatch(name, diffs)
                zone, capacity = self.plan.choices[choice]
                progress.capacity_of[name] = str(capacity)
                progress.zone_of[name] = zone
                moved = self._one_zone(progress, name, pool, choice)
                if moved is not None:
                    return moved
            if status in _BUSY_STATES:
                return self._wait_on_busy_pool(name, status, choice)
        if cleaning:
            raise NodePoolFailed(progress.failure or "", retryable=progress.failure_retryable)
        return Done(self.result(progress))

    def _one_zone(self, progress: Progress, name: str, pool: dict[str, Any], choice: int) -> Step | None:
        """Keep every slice of a run in one zone: a pool found at a later choice (a retry adopting it) moves the
        run there; one of ours left in a zone the run has since left is deleted, to be made again where the run
        is now."""
        if len(self.plan.zones) < 2:
            return None
        if choice > progress.choice:
            progress.choice = choice
            return None
        zone, current = self.plan.choices[choice][0], self.plan.choices[progress.choice][0]
        if zone == current or not self._owned(progress, name, pool):
            return None
        log.warning("Node pool %s is in %s but the run's slices moved to %s; deleting it", name, zone, current)
        progress.created = [n for n in progress.created if n != name]
        progress.zone_of.pop(name, None)
        return self._delete(progress, name)

    def result(self, progress: Progress) -> dict[str, Any]:
        names = list(self.plan.names)
        return {
            **self.plan.describe(),
            "node_pool_name": names[0],
            "capacity": {n: progress.capacity_of.get(n) for n in names},
            # where the slice landed: every later step (RayCluster, ledger) follows this zone
            "node_zone": progress.zone_of.get(names[0], self.plan.node_zone),
            "zone": {n: progress.zone_of.get(n, self.plan.node_zone) for n in names},
            "created": [n for n in names if n in progress.created],
            "adopted": [n for n in names if n not in progress.created],
            "stockouts": list(progress.tried),
        }


class _NamedPoolsLoop(_Loop):
    """A loop over node pools named up front (delete, mark kept)."""

    def __init__(
        self, hook: GKENodePoolHook, project_id: str, cluster_name: str, names: list[str], policy: RetryPolicy
    ) -> None:
        super().__init__(hook, project_id, cluster_name, policy)
        self.names = names


class NodePoolRemover(_NamedPoolsLoop):
    """Delete node pools and wait until they are gone; a pool that does not exist counts as deleted."""

    def _absorb(self, progress: Progress, wait: WaitForOperation, failure: GKEFailure | None) -> None:
        self._absorb_delete(progress, wait, failure)

    def _pass(self, progress: Progress) -> Step | None:
        for name in self.names:
            pool = self._get(name)
            if pool is None:
                continue
            status = pool.get("status", "")
            if status in _BUSY_STATES:
                return self._wait_on_busy_pool(name, status, None)
            outcome = self._delete(progress, name)
            if outcome is not None:
                return outcome
        return Done(
            {
                "project_id": self.project_id,
                "location": self.hook.location,
                "cluster_name": self.cluster_name,
                "deleted": [n for n in self.names if n in progress.deleted],
                "absent": [n for n in self.names if n not in progress.deleted],
            }
        )


class NodePoolKeeper(_NamedPoolsLoop):
    """Mark node pools kept (a ``keep_endpoint`` teardown): GKE replaces their resourceLabels with the same ones
    plus ``tpuflow-kept=true`` and without ``tpuflow-expires`` (nodePools.update, waited for like a delete), so
    the orphan reaper leaves them. A pool that does not exist is absent; one already marked is left as it is."""

    def _absorb(self, progress: Progress, wait: WaitForOperation, failure: GKEFailure | None) -> None:
        if wait.action != "label" or (failure is not None and failure.kind is FailureKind.NOT_FOUND):
            return  # another operation on the pool (or the pool is gone): the next pass looks again
        if failure is None:
            progress.labelled.append(wait.pool)
            return
        if failure.kind.wait_and_retry and progress.busy_retries < self.policy.max_busy_retries:
            progress.busy_retries += 1
            return
        why = self._explain(failure, "update", f"node pool {wait.pool}")
        raise NodePoolFailed(self._unmarked(wait.pool, why), retryable=True)

    def _unmarked(self, name: str, why: str) -> str:
        return (
            f"Node pool {name} was kept but could not be marked kept, so the orphan reaper may delete it once its "
            f"run is over: {why}"
        )

    def _label(self, progress: Progress, name: str, labels: dict[str, str]) -> Step | None:
        try:
            operation = self.hook.set_node_pool_resource_labels(
                project_id=self.project_id, cluster_name=self.cluster_name, node_pool_name=name, labels=labels
            )
        except GoogleAPICallError as exc:
            return self._pool_call_failed(progress, exc, "update", name, lambda why: self._unmarked(name, why))
        log.info("Marking node pool %s kept: operation %s", name, operation.name)
        return WaitForOperation(operation.name, "label", name)

    def _pass(self, progress: Progress) -> Step | None:

        kept, absent = [], []
        for name in self.names:
            pool = self._get(name)
            if pool is None:
                absent.append(name)
                continue
            labels = (pool.get("config") or {}).get("resourceLabels") or {}
            if is_kept(labels) and EXPIRES_LABEL not in labels:
                kept.append(name)
                continue
            status = pool.get("status", "")
            if status in _BUSY_STATES:
                return self._wait_on_busy_pool(name, status, None)
            if name in progress.labelled:
                raise NodePoolFailed(
                    self._unmarked(name, "GKE finished the update, but the pool's resourceLabels do not show it"),
                    retryable=True,
                )
            outcome = self._label(progress, name, kept_labels(labels))
            if outcome is not None:
                return outcome
            absent.append(name)  # gone since we read it
        return Done(
            {
                "project_id": self.project_id,
                "location": self.hook.location,
                "cluster_name": self.cluster_name,
                "kept": True,
                "deleted": [],
                "marked_kept": kept,
                "absent": absent,
            }
        )


def kill_owned_pools(hook: GKENodePoolHook, owned: dict[str, Any]) -> list[str]:
    """Start deleting the pools a killed create task owns; return those GKE cannot delete yet.

    ``owned``: {"project_id", "cluster_name", "node_pool_names", "owner_key"} (the hook is for the
    location). Only pools labelled with ``owner_key`` are touched; gone or STOPPING ones are skipped. A
    pool with an operation still running on it (its create) cannot be deleted before that operation
    ends: GKE answers "is currently creating node pool ... try again", and the name is returned.
    """
    project_id, cluster_name = owned["project_id"], owned["cluster_name"]
    waiting: list[str] = []
    for name in owned["node_pool_names"]:
        pool = hook.get_node_pool(project_id=project_id, cluster_name=cluster_name, node_pool_name=name)
        if pool is None or pool.status.name == "STOPPING":
            continue
        if pool.config.resource_labels.get(OWNER_KEY_LABEL) != owned.get("owner_key"):
            log.info("Node pool %s was not created by this task; leaving it", name)
            continue
        try:
            hook.delete_node_pool(project_id=project_id, cluster_name=cluster_name, node_pool_name=name)
            log.warning("Task killed: deleting node pool %s", name)
        except GoogleAPICallError as exc:
            failure = classify_exception(exc)
            if failure.kind.wait_and_retry:
                waiting.append(name)
            else:
                log.error(
                    "Task killed, but node pool %s could not be deleted (%s): delete it with `gcloud container "
                    "node-pools delete %s --cluster=%s --location=%s --project=%s`",
                    name,
                    failure,
                    name,
                    cluster_name,
                    hook.location,
                    project_id,
                )
    return waiting
