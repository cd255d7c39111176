"""Multi-host tpu7x without a workload policy: the create operator makes the HIGH_THROUGHPUT policy through
the real google-cloud-compute client (against the Compute stand-in the GKE stand-in serves), the pool is
placed by it, and the delete operator removes it after the pool; a policy the user gave is never touched."""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE, context

from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator
from tpuflow.gke.workload_policy import workload_policy_name
from tpuflow.naming import TaskIdentity

REGION = "us-east5"
FAST = {"poll_interval": 0.05, "retry_backoff": 0.05, "max_backoff": 0.2}
TPU7X = {"cluster_name": CLUSTER, "tpu_slice": {"accelerator": "tpu7x", "topology": "2x2x2"}}
POLICIES = f"/compute/v1/projects/{PROJECT}/regions/{REGION}/resourcePolicies"


def create_op(**kwargs: Any) -> GKECreateTPUNodePoolOperator:
    args = {"project_id": PROJECT, "location": ZONE, "gcp_conn_id": CONN_ID, **TPU7X, **FAST, **kwargs}
    return GKECreateTPUNodePoolOperator(task_id="create_pool", **args)


def delete_op(**kwargs: Any) -> GKEDeleteNodePoolOperator:
    args = {"project_id": PROJECT, "location": ZONE, "cluster_name": CLUSTER, "gcp_conn_id": CONN_ID, **FAST, **kwargs}
    return GKEDeleteNodePoolOperator(task_id="delete_pool", **args)


def teardown() -> dict[str, Any]:
    return delete_op(created_by_task_id="create_pool").execute(context(task_id="delete_pool"))


def our_policy_name() -> str:
    return workload_policy_name(TaskIdentity.from_context(context()), "tpu7x", "2x2x2")


def make_by_hand(gke: Any, name: str, topology: str = "2x2x2", description: str = "") -> None:
    body = {"name": name, "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": topology}}
    operation = gke.compute.insert(PROJECT, REGION, {**body, "description": description})
    gke.compute.wait_operation(PROJECT, REGION, operation["name"])


def calls(gke: Any) -> list[tuple[str, str]]:
    """(method, what) of every API call: "policy" (Compute resource policies) or "pool" (GKE node pools)."""
    out = []
    for r in gke.requests:
        if r["path"].startswith(POLICIES):
            out.append((r["method"], "policy"))
        elif "/nodePools" in r["path"]:
            out.append((r["method"], "pool"))
    return out


def test_the_pool_is_placed_by_the_policy_the_operator_made_and_teardown_removes_both(gke):
    ctx = context()
    result = create_op().execute(ctx)

    [policy] = gke.compute.policies()
    assert policy["name"] == our_policy_name() == result["made_workload_policy"]["name"]
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    key = TaskIdentity.from_context(ctx).key
    assert f"tpuflow-key={key}" in policy["description"] and "task create_pool" in policy["description"]
    [pool] = gke.node_pools()
    assert pool["status"] == "RUNNING" and pool["nodeCount"] == 2
    assert pool["config"]["machineType"] == "tpu7x-standard-4t"
    assert pool["placementPolicy"] == {"policyName": policy["name"]}
    assert pool["nodeLabels"]["cloud.google.com/gke-tpu-topology"] == "2x2x2"
    # The policy is made (its operation done) before the pool is asked for.
    assert calls(gke).index(("POST", "policy")) < calls(gke).index(("POST", "pool"))
    assert result["made_workload_policy"] == {
        "name": policy["name"],
        "region": REGION,
        "type": "HIGH_THROUGHPUT",
        "topology": "2x2x2",
        "created": True,
        "adopted": False,
    }

    deleted = teardown()
    assert deleted["deleted"] == [pool["name"]]
    assert deleted["workload_policies"] == {"deleted": [policy["name"]], "kept": []}
    assert gke.node_pools() == [] and gke.compute.policies() == []
    # The policy went after the pool (while a pool uses it, Compute refuses and the teardown would fail).
    assert calls(gke).index(("DELETE", "policy")) > calls(gke).index(("DELETE", "pool"))


def test_a_retry_adopts_the_policy_and_pool_of_its_earlier_try(gke):
    first = create_op().execute(context(try_number=1))
    second = create_op().execute(context(try_number=2))
    assert second["made_workload_policy"]["adopted"] is True and second["adopted"] == first["created"]
    assert [c for c in calls(gke) if c[0] == "POST"] == [("POST", "policy"), ("POST", "pool")]
    assert len(gke.compute.policies()) == 1 and len(gke.node_pools()) == 1


def test_an_identical_policy_made_by_hand_is_adopted_and_kept_after_teardown(gke):
    make_by_hand(gke, our_policy_name(), description="made by the platform team")
    result = create_op().execute(context())
    assert result["made_workload_policy"]["adopted"] is True
    assert ("POST", "policy") not in calls(gke)
    assert teardown()["workload_policies"] == {"deleted": [], "kept": [our_policy_name()]}
    assert [p["name"] for p in gke.compute.policies()] == [our_policy_name()]


def test_a_different_policy_of_that_name_is_refused_in_one_line_before_any_pool(gke):
    make_by_hand(gke, our_policy_name(), topology="2x2x4")
    with pytest.raises(AirflowFailException) as failed:
        create_op().execute(context())
    message = str(failed.value)
    assert "\n" not in message
    assert f"Workload policy {our_policy_name()} already exists in {REGION}" in message
    assert "acceleratorTopology 2x2x4, not 2x2x2" in message and "not reused" in message
    assert f"gcloud compute resource-policies delete {our_policy_name()} --region={REGION}" in message
    assert ("POST", "pool") not in calls(gke) and gke.node_pools() == []
    assert gke.compute.policies()[0]["workloadPolicy"]["acceleratorTopology"] == "2x2x4"  # left alone


def test_a_policy_the_user_gave_is_used_and_never_deleted(gke):
    make_by_hand(gke, "team-ht-2x2x2")
    result = create_op(workload_policy="team-ht-2x2x2").execute(context())
    assert "made_workload_policy" not in result and result["workload_policy"] == "team-ht-2x2x2"
    [pool] = gke.node_pools()
    assert pool["placementPolicy"] == {"policyName": "team-ht-2x2x2"}
    assert ("POST", "policy") not in calls(gke)
    assert teardown()["workload_policies"]["deleted"] == []
    assert [p["name"] for p in gke.compute.policies()] == ["team-ht-2x2x2"]


def test_a_failed_create_deletes_the_policy_it_made_with_its_pools(gke):
    gke.add_fault("stockout", times=10)
    with pytest.raises(AirflowException, match="GCE_STOCKOUT|stockout|capacity"):
        create_op(stockout_retries=0).execute(context())
    assert gke.node_pools() == [] and gke.compute.policies() == []


def test_a_teardown_retry_after_the_pools_are_gone_still_finds_the_policy(gke):
    create_op().execute(context())
    [pool] = gke.node_pools()
    delete_op(node_pool_name=pool["name"]).execute(context(task_id="delete_pool", try_number=1))
    # The first try deleted the pool (and, naming the pool, its policy); a leftover policy is found by name.
    make_by_hand(gke, our_policy_name(), description=f"tpuflow-key={TaskIdentity.from_context(context()).key}")
    assert teardown()["workload_policies"]["deleted"] == [our_policy_name()]
    assert gke.compute.policies() == []


def _run_deferred(op: Any, ctx: dict[str, Any]) -> tuple[Any, list[Any]]:
    """execute() through every deferral, each trigger rebuilt from its JSON form as the triggerer does."""
    triggers = []
    step = lambda: op.execute(ctx)  # noqa: E731
    while True:
        try:
            return step(), triggers
        except TaskDeferred as deferred:
            classpath, kwargs = deferred.trigger.serialize()
            module, _, name = classpath.rpartition(".")
            trigger = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
            triggers.append(trigger)
            event = asyncio.run(trigger.run().__anext__()).payload
            method = getattr(op, deferred.method_name)
            step = lambda method=method, event=event: method(ctx, event)  # noqa: E731


def test_deferrable_create_and_delete_wait_for_compute_in_the_triggerer(gke):
    result, triggers = _run_deferred(create_op(deferrable=True), context())
    assert type(triggers[0]).__name__ == "NodePoolBackoffTrigger" and "workload policy" in triggers[0].reason
    assert result["made_workload_policy"]["created"] is True
    assert gke.node_pools()[0]["placementPolicy"] == {"policyName": our_policy_name()}
    deleted, _ = _run_deferred(
        delete_op(created_by_task_id="create_pool", deferrable=True), context(task_id="delete_pool")
    )
    assert deleted["workload_policies"]["deleted"] == [our_policy_name()]
    assert gke.node_pools() == [] and gke.compute.policies() == []


def test_a_busy_gke_while_the_policy_placed_pool_is_created_is_waited_out(gke):
    """GKE refusing the pool's create as busy (too many operations on the cluster) is backed off and tried again
    under a workload policy too: the policy provisioner's own backoff for Compute had shadowed the pool's, and the
    pool's busy answer raised a TypeError."""
    gke.add_fault("too_many_operations", times=2)
    result = create_op().execute(context())
    assert [p["name"] for p in gke.node_pools()] == [result["node_pool_names"][0]]
    assert [p["name"] for p in gke.compute.policies()] == [our_policy_name()]
    teardown()
    assert gke.node_pools() == [] and gke.compute.policies() == []
