"""The workload policy steps of the node pool loops (tpuflow.gke.provisioning): make or adopt the policy
before the first pool, delete it after the last pool is gone.

Compute operations are waited for the way the loops wait out a backoff: a ``Sleep`` step of
``poll_interval`` (in the triggerer when deferrable), then the next pass reads the operation again. All
state lives in ``Progress.workload_policy`` (plain JSON), so a resumed or retried task continues:

- create: ``{"operation", "created", "ready", "retries"}``
- delete: ``{"policies": [{"name", "region", "owner_key", "guess", "operation", "outcome"}]}``
"""

from __future__ import annotations

import logging
from typing import Any

from google.api_core.exceptions import Conflict, GoogleAPICallError
from google.cloud.compute_v1.types import Operation as ComputeOperation

from tpuflow.gke.hooks import ComputeResourcePolicyHook, GKENodePoolHook, to_rest_json
from tpuflow.gke.nodepool_spec import NodePoolPlan
from tpuflow.gke.provisioning import (
    Done,
    NodePoolFailed,
    NodePoolProvisioner,
    NodePoolRemover,
    Progress,
    RetryPolicy,
    Sleep,
    Step,
)
from tpuflow.gke.workload_policy import owner_of, region_of, workload_policy_name
from tpuflow.labels import OWNER_KEY_LABEL
from tpuflow.naming import TaskIdentity

log = logging.getLogger(__name__)

_RETRY_CODES = (429, 500, 502, 503, 504)
COMPUTE_DONE = ComputeOperation.Status.DONE


def compute_operation_error(operation: ComputeOperation) -> str | None:
    errors = list(operation.error.errors) if operation.error else []
    if errors:
        return "; ".join(f"{e.code}: {e.message}" if e.code else e.message for e in errors)
    if operation.http_error_status_code and operation.http_error_status_code >= 400:
        return f"HTTP {operation.http_error_status_code} {operation.http_error_message}".strip()
    return None


def _delete_command(project_id: str, region: str, name: str) -> str:
    return f"`gcloud compute resource-policies delete {name} --region={region} --project={project_id}`"


def _remove_policy(
    compute: ComputeResourcePolicyHook, project_id: str, entry: dict[str, Any], poll_interval: float
) -> Step | None:
    """One step of deleting one policy ``entry``; None once its ``outcome`` is known (deleted/absent/kept)."""
    name, region = entry["name"], entry["region"]
    if entry.get("operation"):
        current = compute.get_region_operation(project_id=project_id, region=region, name=entry["operation"])
        if current.status != COMPUTE_DONE:
            return Sleep(poll_interval, f"deleting workload policy {name} (Compute operation {current.name})")
        entry["operation"] = None
        error = compute_operation_error(current)
        if error:
            raise NodePoolFailed(
                f"Deleting workload policy {name} in {region} failed ({error}): delete it with "
                f"{_delete_command(project_id, region, name)}",
                retryable=True,
            )
        entry["outcome"] = "deleted"
        return None
    try:
        policy = compute.get_resource_policy(project_id=project_id, region=region, name=name)
    except GoogleAPICallError as exc:
        if not entry.get("guess"):
            raise NodePoolFailed(
                f"Reading workload policy {name} in {region} failed ({exc.message}); it may still exist: "
                f"delete it with {_delete_command(project_id, region, name)}",
                retryable=True,
            ) from exc
        # Only a guess from created_by_task_id (no pool named it): not worth failing a teardown over.
        log.warning("Could not look for workload policy %s in %s (%s); leaving it", name, region, exc.message)
        entry["outcome"] = "unknown"
        return None
    if policy is None:
        entry["outcome"] = entry.get("outcome") or "absent"
        return None
    if not entry.get("owner_key") or owner_of(policy.description) != entry["owner_key"]:
        log.info("Workload policy %s was not made by the task that made these pools; keeping it", name)
        entry["outcome"] = "kept"
        return None
    try:
        operation = compute.delete_resource_policy(project_id=project_id, region=region, name=name)
    except GoogleAPICallError as exc:
        raise NodePoolFailed(
            f"Deleting workload policy {name} in {region} was refused ({exc.message}): delete it with "
            f"{_delete_command(project_id, region, name)} once nothing uses it",
            retryable=True,
        ) from exc
    if operation is None:
        entry["outcome"] = "absent"
        return None
    entry["operation"] = operation.name
    log.info("Deleting workload policy %s in %s: operation %s", name, region, operation.name)
    return Sleep(poll_interval, f"deleting workload policy {name} (Compute operation {operation.name})")


class WorkloadPolicyFirstProvisioner(NodePoolProvisioner):
    """NodePoolProvisioner for a plan whose workload policy the task makes (``plan.made_workload_policy``):
    make it (or adopt an identical one of that name) before any pool; refuse a different one in one line.
    A failure that cleans up the pools also deletes the policy this task created."""

    def __init__(
        self, hook: GKENodePoolHook, plan: NodePoolPlan, policy: RetryPolicy, compute: ComputeResourcePolicyHook
    ) -> None:
        super().__init__(hook, plan, policy)
        if plan.made_workload_policy is None:
            raise ValueError("the plan names its own workload policy; use NodePoolProvisioner")
        self.wp = plan.made_workload_policy
        self.compute = compute

    def _pass(self, progress: Progress) -> Step | None:
        state = progress.workload_policy
        if progress.failure is None:
            if not state.get("ready"):
                step = self._ensure(state)
                if step is not None:
                    return step
            return super()._pass(progress)
        try:
            return super()._pass(progress)
        except NodePoolFailed:
            if not state.get("created"):
                raise
            entry = state.setdefault(
                "cleanup", {"name": self.wp.name, "region": self.wp.region, "owner_key": self.wp.owner_key}
            )
            if entry.get("outcome") is None:
                try:
                    step = _remove_policy(self.compute, self.project_id, entry, self.policy.poll_interval)
                except NodePoolFailed as cleanup_error:
                    log.error("%s", cleanup_error)
                    entry["outcome"] = "failed"
                    step = None
                if step is not None:
                    return step
            raise

    def _policy_busy(self, state: dict[str, Any], why: str) -> Sleep:
        state["retries"] = int(state.get("retries", 0)) + 1
        if state["retries"] > self.policy.max_busy_retries:
            raise NodePoolFailed(
                f"Creating workload policy {self.wp.name} in {self.wp.region} kept failing ({why}); no node pool "
                "was created.",
                retryable=True,
            )
        return Sleep(self.policy.delay(state["retries"]), f"Compute: {why}")

    def _ensure(self, state: dict[str, Any]) -> Step | None:
        """A step while the policy is not there yet; None once the identical policy exists (``ready``)."""
        wp, where = self.wp, {"project_id": self.wp.project_id, "region": self.wp.region}
        if state.get("operation"):
            current = self.compute.get_region_operation(**where, name=state["operation"])
            if current.status != COMPUTE_DONE:
                return Sleep(self.policy.poll_interval, f"creating workload policy {wp.name} ({current.name})")
            state["operation"] = None
            error = compute_operation_error(current)
            if error:
                raise NodePoolFailed(
                    f"Creating workload policy {wp.name} in {wp.region} failed ({error}); no node pool was created.",
                    retryable=False,
                )
        existing = self.compute.get_resource_policy(**where, name=wp.name)
        if existing is None:
            try:
                operation = self.compute.insert_resource_policy(**where, resource_policy=wp.body())
            except Conflict:
                return self._policy_busy(state, f"workload policy {wp.name} is being created by someone else")
            except GoogleAPICallError as exc:
                if exc.code in _RETRY_CODES:
                    return self._policy_busy(state, str(exc.message))
                raise NodePoolFailed(
                    f"Creating workload policy {wp.name} in {wp.region} was refused ({exc.message}); no node pool "
                    f"was created. The same request by hand: `{wp.gcloud()}`",
                    retryable=False,
                ) from exc
            state["operation"], state["created"] = operation.name, True
            log.info(
                "Creating workload policy %s (%s %s): operation %s",
                wp.name,
                "HIGH_THROUGHPUT",
                wp.topology,
                operation.name,
            )
            return Sleep(self.policy.poll_interval, f"creating workload policy {wp.name} ({operation.name})")
        diffs = wp.differences(to_rest_json(existing))
        if diffs:
            raise NodePoolFailed(
                f"Workload policy {wp.name} already exists in {wp.region} but is not a HIGH_THROUGHPUT policy for "
                f"{wp.topology} ({'; '.join(diffs)}); it was not reused and no node pool was created: delete it with "
                f"{_delete_command(wp.project_id, wp.region, wp.name)} or pass workload_policy=NAME of a "
                f"HIGH_THROUGHPUT {wp.topology} policy.",
                retryable=False,
            )
        if existing.status and existing.status != "READY":
            return Sleep(self.policy.poll_interval, f"workload policy {wp.name} is {existing.status}")
        if not state.get("created"):
            log.info("Adopting the existing workload policy %s in %s", wp.name, wp.region)
        state["ready"] = True
        return None

    def result(self, progress: Progress) -> dict[str, Any]:
        created = bool(progress.workload_policy.get("created"))
        return {
            **super().result(progress),
            "made_workload_policy": {**self.wp.describe(), "created": created, "adopted": not created},
        }


def policies_to_delete(
    hook: GKENodePoolHook,
    *,
    project_id: str,
    cluster_name: str,
    location: str,
    names: list[str],
    created_by: TaskIdentity | None,
) -> list[dict[str, Any]]:
    """The workload policies a delete task removes after the pools: those its pools are placed by, and
    the one ``created_by``'s create task would have made (a retry finds it even when the pools are gone).
    Each is deleted only if its description names the pools' owner (never a policy the user gave)."""
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    for name in names:
        pool = hook.get_node_pool(project_id=project_id, cluster_name=cluster_name, node_pool_name=name)
        if pool is None or not pool.placement_policy.policy_name:
            continue
        policy = pool.placement_policy.policy_name
        region = region_of(pool.locations[0] if pool.locations else location)
        entries[(region, policy)] = {
            "name": policy,
            "region": region,
            "owner_key": pool.config.resource_labels.get(OWNER_KEY_LABEL),
        }
    if created_by is not None and (entries or not names):
        region = region_of(location)
        guess = {"name": workload_policy_name(created_by, "", ""), "region": region, "owner_key": created_by.key}
        entries.setdefault((region, guess["name"]), {**guess, "guess": True})
    return [{**e, "operation": None, "outcome": None} for e in entries.values()]


class NodePoolThenPolicyRemover(NodePoolRemover):
    """NodePoolRemover that then deletes the workload policies ``Progress.workload_policy["policies"]``
    names (see policies_to_delete), once every pool is gone."""

    def __init__(
        self,
        hook: GKENodePoolHook,
        project_id: str,
        cluster_name: str,
        names: list[str],
        policy: RetryPolicy,
        compute: ComputeResourcePolicyHook,
    ) -> None:
        super().__init__(hook, project_id, cluster_name, names, policy)
        self.compute = compute

    def _pass(self, progress: Progress) -> Step | None:
        step = super()._pass(progress)
        if not isinstance(step, Done):
            return step
        entries = progress.workload_policy.get("policies") or []
        for entry in entries:
            if entry.get("outcome") is None:
                outcome = _remove_policy(self.compute, self.project_id, entry, self.policy.poll_interval)
                if outcome is not None:
                    return outcome
        if not entries:
            return step
        return Done(
            {
                **step.result,
                "workload_policies": {
                    "deleted": [e["name"] for e in entries if e["outcome"] == "deleted"],
                    "kept": [e["name"] for e in entries if e["outcome"] == "kept"],
                },
            }
        )
