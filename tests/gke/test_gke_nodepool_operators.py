"""The node pool operators against the GKE stand-in, through the real hook and google-cloud-container
client (REST transport, anonymous credentials, endpoint from the Airflow connection)."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE, context

from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator

FAST = {"poll_interval": 0.05, "retry_backoff": 0.05, "max_backoff": 0.2}
V6E_4X4 = {"accelerator": "v6e", "topology": "4x4"}
V5P_2X2X2_TWICE = {"accelerator": "v5p", "topology": "2x2x2", "num_slices": 2}


def create_op(task_id: str = "create_pool", **kwargs: Any) -> GKECreateTPUNodePoolOperator:
    args = {"project_id": PROJECT, "location": ZONE, "gcp_conn_id": CONN_ID, **FAST, **kwargs}
    args.setdefault("cluster_name", CLUSTER)
    args.setdefault("tpu_slice", V6E_4X4)
    return GKECreateTPUNodePoolOperator(task_id=task_id, **args)


def delete_op(**kwargs: Any) -> GKEDeleteNodePoolOperator:
    args = {"project_id": PROJECT, "location": ZONE, "cluster_name": CLUSTER, "gcp_conn_id": CONN_ID, **FAST, **kwargs}
    return GKEDeleteNodePoolOperator(task_id="delete_pool", **args)


def posts(gke: Any) -> list[dict[str, Any]]:
    return [r for r in gke.requests if r["method"] == "POST"]


def queue_faults(gke: Any, *faults: dict[str, Any]) -> None:
    """Fault injection over the stand-in's HTTP control path, as the local pipeline does it."""
    request = urllib.request.Request(
        gke.url + "/_standin/faults",
        data=json.dumps({"faults": list(faults)}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert len(json.load(response)["queued"]) == len(faults)


def test_create_provisions_the_slice_and_reports_it(gke):
    ctx = context()
    result = create_op(capacity="spot").execute(ctx)

    [pool] = gke.node_pools()
    assert pool["status"] == "RUNNING"
    assert pool["name"] == result["node_pool_name"] == ctx["ti"].xcoms["node_pool_name"]
    assert pool["config"]["machineType"] == "ct6e-standard-4t" and pool["nodeCount"] == 4
    assert pool["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
    assert pool["config"]["spot"] is True
    # The k8s side can find the slice by the labels TPU pods select on.
    assert (
        gke.find_node_pools(
            {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "4x4"},
            nodes=4,
        )[0]["name"]
        == pool["name"]
    )
    # Ownership labels: GCE label rules, exact identity digest, expiry in the future.
    labels = pool["config"]["resourceLabels"]
    assert labels["tpuflow-dag"] == "train_dag" and labels["tpuflow-task"] == "create_pool"
    assert labels["tpuflow-run"] == "manual__2026-11-29t10_00_00_00_00"
    assert int(labels["tpuflow-expires"]) > time.time() + 23 * 3600
    # ... and GKE itself ends the nodes at that expiry, whether or not Airflow and the reaper are up
    assert pool["config"]["maxRunDuration"] == "86400s" and result["max_run_duration_s"] == 86400
    assert result["created"] == [pool["name"]] and result["adopted"] == []
    assert result["capacity"] == {pool["name"]: "spot"}
    assert result["node_selector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert ctx["ti"].xcoms["gke_node_pool"] == (
        f"https://console.cloud.google.com/kubernetes/nodepool/{ZONE}/{CLUSTER}/{pool['name']}?project={PROJECT}"
    )


@pytest.mark.parametrize(
    ("arguments", "sent"),
    [
        ({"expires_after": timedelta(hours=2)}, "7200s"),
        ({"max_run_duration": timedelta(minutes=90, seconds=0.5)}, "5401s"),
        ({"max_run_duration": "3600"}, "3600s"),  # as a template renders it
        ({"max_run_duration": None}, None),
        ({"max_run_duration": ""}, None),
        ({"capacity": "flex-start", "expires_after": timedelta(days=9)}, "604800s"),  # GKE's cap for flex-start
    ],
)
def test_the_pools_max_run_duration(gke, arguments, sent):
    create_op(**arguments).execute(context())
    [pool] = gke.node_pools()
    assert pool["config"].get("maxRunDuration") == sent


def test_a_retry_adopts_the_pool_instead_of_creating_a_second(gke):
    first = create_op().execute(context(try_number=1))
    second = create_op().execute(context(try_number=2))

    assert len(posts(gke)) == 1
    assert len(gke.node_pools()) == 1
    assert second["node_pool_name"] == first["node_pool_name"]
    assert second["adopted"] == [first["node_pool_name"]] and second["created"] == []


def test_a_retry_waits_for_the_create_its_earlier_try_started(gke):
    """The worker died while GKE was still creating: the retry follows that operation."""
    from tpuflow.gke.hooks import GKENodePoolHook
    from tpuflow.naming import TaskIdentity

    op = create_op()
    plan = op.plan(TaskIdentity("train_dag", "manual__2026-11-29T10:00:00+00:00", "create_pool"), 2_000_000_000)
    gke.operation_seconds = 0.6
    GKENodePoolHook(gcp_conn_id=CONN_ID, location=ZONE).create_node_pool(
        project_id=PROJECT, cluster_name=CLUSTER, node_pool=plan.body()
    )
    result = op.execute(context(try_number=2))

    assert len(posts(gke)) == 1
    assert result["adopted"] == [plan.names[0]]
    assert [p["status"] for p in gke.node_pools()] == ["RUNNING"]


def test_a_pool_with_the_same_name_but_another_spec_is_an_error_and_is_left_alone(gke):
    create_op(
        node_pool_name="shared-pool", tpu_slice={**V6E_4X4, "topology": "2x4", "machine_type": "ct6e-standard-4t"}
    ).execute(context())
    with pytest.raises(AirflowFailException) as err:
        create_op(node_pool_name="shared-pool").execute(context(task_id="other"))

    message = str(err.value)
    assert "shared-pool already exists" in message
    assert "placementPolicy.tpuTopology: want '4x4', found '2x4'" in message
    assert "initialNodeCount: want 4, found 2" in message
    [pool] = gke.node_pools()
    assert pool["status"] == "RUNNING" and pool["placementPolicy"]["tpuTopology"] == "2x4"
    assert len(posts(gke)) == 1


def test_delete_waits_until_the_pool_is_gone(gke):
    created = create_op().execute(context())
    result = delete_op(node_pool_name=created["node_pool_name"]).execute(context(task_id="delete_pool"))

    assert result["deleted"] == [created["node_pool_name"]]
    assert gke.node_pools() == []


def test_delete_finds_the_pools_a_task_created_by_their_ownership_label(gke):
    created = create_op(tpu_slice=V5P_2X2X2_TWICE).execute(context())
    other = create_op(tpu_slice={"accelerator": "v6e", "topology": "2x2"}).execute(context(task_id="other_task"))
    assert len(created["node_pool_names"]) == 2  # one pool per multi-host slice
    assert len(gke.find_node_pools({"cloud.google.com/gke-tpu-topology": "2x2x2"}, nodes=2)) == 2

    result = delete_op(created_by_task_id="create_pool").execute(context(task_id="delete_pool"))

    assert sorted(result["deleted"]) == sorted(created["node_pool_names"])
    assert [p["name"] for p in gke.node_pools()] == other["node_pool_names"]


def test_deleting_a_missing_pool_is_success(gke):
    result = delete_op(node_pool_name="never-created").execute(context(task_id="delete_pool"))
    assert result["deleted"] == [] and result["absent"] == ["never-created"]


def test_a_stockout_falls_back_to_the_next_capacity_choice(gke):
    queue_faults(gke, {"kind": "stockout", "capacity": "spot"})
    result = create_op(capacity="spot", fallback_capacity=["on-demand"]).execute(context())

    name = result["node_pool_name"]
    assert result["capacity"] == {name: "on-demand"} and result["stockouts"] == ["spot"]
    [pool] = gke.node_pools()
    assert pool["status"] == "RUNNING" and "spot" not in pool["config"]
    # The failed spot pool was deleted before the on-demand one was created.
    methods = [
        (r["method"], (r["body"] or {}).get("nodePool", {}).get("config", {}).get("spot"))
        for r in gke.requests
        if r["method"] in ("POST", "DELETE")
    ]
    assert methods == [("POST", True), ("DELETE", None), ("POST", None)]


def test_a_stockout_on_every_choice_fails_after_retries_and_leaves_nothing_behind(gke):
    queue_faults(gke, {"kind": "stockout", "times": 10})
    with pytest.raises(AirflowException) as err:
        create_op(capacity="spot", fallback_capacity="on-demand", stockout_retries=1).execute(context())

    assert not isinstance(err.value, AirflowFailException)  # an Airflow retry may find capacity later
    message = str(err.value)
    assert f"No capacity for a v6e 4x4 slice (ct6e-standard-4t) in zone {ZONE}" in message
    assert "tried spot, on-demand" in message and "GCE_STOCKOUT" in message
    assert len(posts(gke)) == 3  # spot, on-demand, on-demand again after a backoff
    assert gke.node_pools() == []


def test_quota_exceeded_fails_at_once_naming_the_quota(gke):
    queue_faults(gke, {"kind": "quota", "capacity": "spot"})
    with pytest.raises(AirflowFailException) as err:
        create_op(capacity="spot", fallback_capacity=["on-demand"]).execute(context())

    message = str(err.value)
    assert message.startswith("Quota PREEMPTIBLE_TPU_V6E_SLICE is too small")
    assert f"Request more of PREEMPTIBLE_TPU_V6E_SLICE for project {PROJECT}" in message
    assert len(posts(gke)) == 1  # no fallback on quota
    assert gke.node_pools() == []  # the ERROR pool was cleaned up


def test_quota_refused_at_request_time_also_names_the_quota(gke):
    queue_faults(gke, {"kind": "quota", "stage": "request", "quota_metric": "TPU_V6E_SLICE_CHIPS"})
    with pytest.raises(AirflowFailException, match="Quota TPU_V6E_SLICE_CHIPS is too small"):
        create_op().execute(context())


def test_too_many_operations_waits_and_retries(gke):
    queue_faults(gke, {"kind": "too_many_operations", "times": 2})
    started = time.monotonic()
    result = create_op(retry_backoff=0.15, max_backoff=1.0).execute(context())

    assert time.monotonic() - started >= 0.15 + 0.3  # backoff doubles: 0.15 s, then 0.3 s
    assert len(posts(gke)) == 3
    assert result["created"] == [result["node_pool_name"]]


def test_a_busy_cluster_is_waited_for(gke):
    """GKE's real limit: other operations hold the cluster's concurrency quota until they finish."""
    from tpuflow.gke.hooks import GKENodePoolHook

    gke.max_concurrent_operations = 1
    gke.operation_seconds = 0.4
    GKENodePoolHook(gcp_conn_id=CONN_ID, location=ZONE).create_node_pool(
        project_id=PROJECT,
        cluster_name=CLUSTER,
        node_pool={"name": "cpu-pool", "config": {"machineType": "n2-standard-8"}, "initialNodeCount": 1},
    )
    result = create_op(retry_backoff=0.1).execute(context())
    assert result["created"] == [result["node_pool_name"]]
    assert len(posts(gke)) >= 3  # the CPU pool, at least one refused create, the accepted one


def test_too_many_operations_for_too_long_fails_with_advice(gke):
    queue_faults(gke, {"kind": "too_many_operations", "times": 5})
    with pytest.raises(AirflowException, match="kept refusing new operations"):
        create_op(max_busy_retries=2).execute(context())


def test_already_exists_from_a_racing_try_is_looked_at_again_not_fatal(gke):
    queue_faults(gke, {"kind": "already_exists"})
    result = create_op().execute(context())
    assert len(posts(gke)) == 2 and result["created"] == [result["node_pool_name"]]


def test_permission_denied_fails_at_once_with_the_role_to_grant(gke):
    queue_faults(gke, {"kind": "permission"})
    with pytest.raises(AirflowFailException) as err:
        create_op().execute(context())
    assert "roles/container.admin" in str(err.value) and "container.clusters.update" in str(err.value)
    assert len(posts(gke)) == 1


def test_invalid_argument_fails_at_once(gke):
    queue_faults(gke, {"kind": "invalid_argument", "message": "Invalid value for field 'nodePool.config'."})
    with pytest.raises(AirflowFailException, match="GKE rejected the request.*Invalid value for field"):
        create_op().execute(context())


def test_a_missing_cluster_is_reported_as_such(gke):
    with pytest.raises(AirflowFailException, match="cluster other-cluster .* was not found"):
        create_op(cluster_name="other-cluster").execute(context())


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        ({"location": "us_east5_b"}, "location", "zone like us-east5-b"),
        ({"location": "us-east5"}, "node_zone", "us-east5 is a region"),
        ({"cluster_name": "My_Cluster"}, "cluster_name", "at most 40 lowercase letters"),
        ({"capacity": "preemptible"}, "capacity", "use spot"),
        ({"capacity": "reservation"}, "capacity", "write reservation:NAME"),
        ({"capacity": "reservation:"}, "capacity", "write reservation:NAME"),
        ({"fallback_capacity": ["spot", "spot"]}, "fallback_capacity", "listed twice"),
        ({"project_id": "My Project"}, "project_id", "project ID"),
        ({"tpu_slice": {**V6E_4X4, "topology": "16"}}, "tpu_slice.topology", "not a chip count"),
        ({"node_labels": {"cloud.google.com/gke-tpu-topology": "4x4"}}, "node_labels", "set by GKE itself"),
        ({"node_taints": ["dedicated=tpu:Sometimes"]}, "node_taints", "NoSchedule"),
    ],
)
def test_bad_input_fails_before_any_api_call_naming_the_field(gke, overrides, field, fix):
    from tpuflow.errors import UserInputError

    with pytest.raises(UserInputError) as err:
        create_op(**overrides).execute(context())
    assert err.value.field == field
    assert fix in str(err.value)
    assert gke.requests == []


def test_static_bad_input_fails_when_the_dag_is_parsed_templated_input_when_the_task_runs(gke):
    from tpuflow.errors import UserInputError

    with pytest.raises(UserInputError, match="capacity='spot-ish'"):
        create_op(capacity="spot-ish")  # no execute: the DAG file would not import
    with pytest.raises(UserInputError, match="exactly one of node_pool_name and created_by_task_id"):
        delete_op()
    op = create_op(capacity="{{ params.capacity }}")  # cannot be checked before rendering
    op.capacity = "spot-ish"  # what the template rendered to
    with pytest.raises(UserInputError, match="capacity='spot-ish'"):
        op.execute(context())
    assert gke.requests == []


# --- kill semantics: marking the task failed/success or clearing it deletes what it owns ---------------
def _deferred_trigger(op: Any, ctx: dict[str, Any]) -> Any:
    """execute() until it defers; the trigger rebuilt from its serialized (JSON) form, as the triggerer does."""
    import importlib

    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    classpath, kwargs = deferred.value.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))


def _statuses(gke: Any) -> dict[str, str]:
    return {p["name"]: p["status"] for p in gke.node_pools()}


def test_killing_the_deferred_create_deletes_the_pool_once_gke_lets_it_but_a_triggerer_restart_does_not(gke):
    import asyncio

    gke.operation_seconds = 0.8
    trigger = _deferred_trigger(create_op(deferrable=True), context())
    [name] = trigger.delete_on_kill["node_pool_names"]

    async def scenario() -> tuple[dict[str, str], dict[str, str]]:
        # A triggerer restart: the wait is cancelled and cleaned up without on_kill. Nothing is deleted.
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.2)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await trigger.cleanup()
        after_restart = _statuses(gke)
        # The user marks the task failed: on_kill waits out the create (GKE refuses a delete until then).
        await trigger.on_kill()
        return after_restart, _statuses(gke)

    after_restart, after_kill = asyncio.run(scenario())
    assert after_restart == {name: "PROVISIONING"}
    assert after_kill in ({name: "STOPPING"}, {})
    # GKE refused the deletes sent while the create ran ("try again once it is done"); the last one went through.
    assert {r["path"].rsplit("/", 1)[-1] for r in gke.requests if r["method"] == "DELETE"} == {name}


def test_a_kill_outlasting_on_kill_timeout_finishes_the_deletion_in_the_triggerers_loop(gke, monkeypatch):
    import asyncio

    monkeypatch.setenv("AIRFLOW__TRIGGERER__ON_KILL_TIMEOUT", "0.5")
    gke.operation_seconds = 1.5
    trigger = _deferred_trigger(create_op(deferrable=True), context())

    async def scenario() -> tuple[float, dict[str, str], dict[str, str]]:
        started = time.monotonic()
        await trigger.on_kill()
        returned_after, at_return = time.monotonic() - started, _statuses(gke)
        for _ in range(100):  # the triggerer's loop keeps running; so does the deletion
            await asyncio.sleep(0.05)
            if set(_statuses(gke).values()) <= {"STOPPING"}:
                break
        return returned_after, at_return, _statuses(gke)

    returned_after, at_return, later = asyncio.run(scenario())
    assert returned_after < 1.0 and set(at_return.values()) == {"PROVISIONING"}
    assert set(later.values()) <= {"STOPPING"}


def test_a_killed_create_leaves_pools_of_another_owner_and_the_delete_task_deletes_nothing_more(gke):
    import asyncio

    gke.operation_seconds = 0.3
    trigger = _deferred_trigger(create_op(deferrable=True), context())
    stranger = {**trigger.delete_on_kill, "owner_key": "another-task"}
    trigger.delete_on_kill = stranger
    asyncio.run(trigger.on_kill())
    assert list(_statuses(gke).values()) in (["PROVISIONING"], ["RUNNING"])
    assert not [r for r in gke.requests if r["method"] == "DELETE"]

    name = stranger["node_pool_names"][0]
    time.sleep(0.4)
    remover = _deferred_trigger(delete_op(node_pool_name=name, deferrable=True), context(task_id="delete_pool"))
    assert remover.delete_on_kill is None  # its wait is already a deletion: killing it adds nothing


def _execute_in_a_thread(op: Any, ctx: dict[str, Any]) -> Any:
    """op.execute(ctx) in a worker thread (started; join it), so the test can kill the task meanwhile."""
    import threading

    def work() -> None:
        try:
            op.execute(ctx)
        except Exception:  # noqa: S110 - whatever the thread ends with, the test looks at the stand-in
            pass

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    return worker


def test_killing_the_create_in_the_worker_deletes_the_finished_pools_and_names_the_one_still_creating(gke, capsys):
    gke.operation_seconds = 1.0
    op = create_op(tpu_slice=V5P_2X2X2_TWICE)
    worker = _execute_in_a_thread(op, context())
    deadline = time.monotonic() + 10
    while sorted(_statuses(gke).values()) != ["PROVISIONING", "RUNNING"]:
        assert time.monotonic() < deadline, _statuses(gke)
        time.sleep(0.02)
    first, second = op._owned[1]["node_pool_names"]  # what on_kill deletes, set while the worker waits

    capsys.readouterr()
    op.on_kill()  # what the task runner's SIGTERM handler calls

    assert _statuses(gke) == {first: "STOPPING", second: "PROVISIONING"}
    assert f"gcloud container node-pools delete {second} --cluster={CLUSTER}" in capsys.readouterr().out
    worker.join(timeout=15)  # in Airflow SIGKILL ends it; here it runs on (recreating the pool) and ends


def test_killing_the_create_during_a_backoff_deletes_the_pools_it_already_made(gke):
    import asyncio

    from tpuflow.gke.triggers import NodePoolBackoffTrigger

    ctx = context()
    created = _deferred_trigger(create_op(deferrable=True), ctx)
    owned = created.delete_on_kill  # what advance() hands every trigger of the create task
    [name] = owned["node_pool_names"]
    event = asyncio.run(created.run().__anext__()).payload
    assert create_op(deferrable=True).execute_complete(ctx, event)["created"] == [name]
    trigger = NodePoolBackoffTrigger(
        wake_at=time.time() + 60, reason="stockout on the next pool", resume={"progress": {}}, delete_on_kill=owned
    )
    rebuilt = NodePoolBackoffTrigger(**json.loads(json.dumps(trigger.serialize()[1])))
    assert NodePoolBackoffTrigger(wake_at=1.0).delete_on_kill is None  # triggers serialized before this kwarg

    asyncio.run(rebuilt.on_kill())
    assert _statuses(gke) in ({name: "STOPPING"}, {})


def test_a_create_that_finished_in_the_worker_owns_nothing_on_kill_deletes(gke):
    """on_kill cleans up what the task waits on: once execute returned (the pool is the task's result), a late
    SIGTERM deletes nothing."""
    op = create_op()
    assert op._owned is None  # declared in __init__
    name = op.execute(context())["node_pool_name"]
    assert op._owned is None
    op.on_kill()
    assert _statuses(gke) == {name: "RUNNING"}
    assert not [r for r in gke.requests if r["method"] == "DELETE"]


# --- on_kill_action="keep": killing the task leaves the pools it made ------------------------------------
def test_on_kill_action_keep_leaves_the_pools_when_killed_in_the_worker_and_while_deferred(gke, capsys):
    import asyncio

    gke.operation_seconds = 1.0
    op = create_op(on_kill_action="keep")
    worker = _execute_in_a_thread(op, context())
    deadline = time.monotonic() + 10
    while op._owned is None or list(_statuses(gke).values()) != ["PROVISIONING"]:
        assert time.monotonic() < deadline, _statuses(gke)
        time.sleep(0.02)
    [name] = _statuses(gke)
    capsys.readouterr()
    op.on_kill()  # what the task runner's SIGTERM handler calls, while the worker waits on the create
    assert f"on_kill_action='keep' leaves node pool(s) {name}" in capsys.readouterr().out
    worker.join(timeout=15)
    assert _statuses(gke) == {name: "RUNNING"}
    assert not [r for r in gke.requests if r["method"] == "DELETE"]

    gke.operation_seconds = 0.3
    trigger = _deferred_trigger(
        create_op(task_id="create_other", deferrable=True, on_kill_action="keep"), context(task_id="create_other")
    )
    assert trigger.delete_on_kill is None
    asyncio.run(trigger.on_kill())
    assert not [r for r in gke.requests if r["method"] == "DELETE"]
    # The default deletes: the same deferral with on_kill_action="delete" names the pool to delete.
    default = _deferred_trigger(create_op(task_id="create_other", deferrable=True), context(task_id="create_other"))
    assert default.delete_on_kill["node_pool_names"] == [p for p in _statuses(gke) if p != name]


def test_on_kill_action_is_checked_when_the_dag_is_parsed(gke):
    from tpuflow.errors import UserInputError

    with pytest.raises(UserInputError, match="on_kill_action='ignore'"):
        create_op(on_kill_action="ignore", capacity="{{ params.capacity }}")


# --- template fields: checked when rendered, in the same check as static ones ----------------------------
def test_a_templated_node_label_is_checked_only_once_rendered_by_the_parse_time_check(gke):
    from tpuflow.errors import UserInputError

    bad = {"example.com/team": "not ok!"}
    with pytest.raises(UserInputError, match="node_labels"):
        create_op(node_labels=bad)  # static: the DAG file would not import
    op = create_op(node_labels={"example.com/team": "{{ params.team }}"})  # templated: not checked yet
    assert op.node_labels == {"example.com/team": "{{ params.team }}"}  # assigned as given
    op.node_labels = bad  # what the template rendered to
    with pytest.raises(UserInputError, match="node_labels"):
        op.execute(context())
    assert gke.requests == []
    delete = delete_op(node_pool_name="{{ ti.xcom_pull(task_ids='create_pool', key='node_pool_name') }}")
    delete.node_pool_name = "Bad_Name"
    with pytest.raises(UserInputError, match="node_pool_name='Bad_Name'"):
        delete.execute(context(task_id="delete_pool"))
    assert gke.requests == []


def test_a_templated_tpu_slice_is_rendered_and_resolved_when_the_task_runs(gke):
    from tpuflow.errors import UserInputError
    from tpuflow.tpu import TpuSlice

    templated = {"accelerator": "{{ params.acc }}", "topology": "{{ params.topo }}"}
    op = create_op(tpu_slice=templated)  # not checked yet: "{{ params.acc }}" is no generation
    assert op.tpu_slice is templated  # assigned as given
    op.render_template_fields({"params": {"acc": "v6e", "topo": "2x4"}})
    assert op.tpu_slice == {"accelerator": "v6e", "topology": "2x4"}
    result = op.execute(context())
    assert result["node_selector"]["cloud.google.com/gke-tpu-topology"] == "2x4"
    assert gke.node_pools()[0]["config"]["machineType"] == "ct6e-standard-8t"

    op = create_op(task_id="other", tpu_slice=dict(templated))
    op.render_template_fields({"params": {"acc": "v6e-typo", "topo": "2x4"}})
    with pytest.raises(UserInputError) as err:
        op.execute(context(task_id="other"))
    assert err.value.field == "tpu_slice.accelerator" and "\n" not in str(err.value)
    assert len(posts(gke)) == 1  # the bad rendered slice reached no API

    tpu = TpuSlice.from_spec("v6e", "4x4")
    op = create_op(task_id="third", tpu_slice=tpu)
    op.render_template_fields({"params": {}})
    assert op.tpu_slice is tpu  # a TpuSlice passes rendering untouched


def test_the_old_slice_kwargs_are_refused(gke):
    where = {"project_id": PROJECT, "location": ZONE, "cluster_name": CLUSTER}
    with pytest.raises(TypeError, match="tpu_slice"):
        GKECreateTPUNodePoolOperator(task_id="t", **where, accelerator="v6e", topology="4x4")
    with pytest.raises(TypeError, match="(?s)Invalid arguments.*'accelerator': 'v6e'"):
        GKECreateTPUNodePoolOperator(task_id="t", **where, tpu_slice=V6E_4X4, accelerator="v6e")


# --- trigger events: the tpuflow.events shape, resumed through raise_for_event ---------------------------
def test_a_broken_wait_fails_the_task_through_raise_for_event_and_a_good_one_resumes(gke):
    op = create_op(deferrable=True)
    with pytest.raises(AirflowException, match="waiting on GKE: error: reading GKE operation x failed"):
        op.execute_complete(
            context(),
            {
                "status": "error",
                "message": "reading GKE operation x failed: boom",
                "resume": {"progress": {}, "waiting": None},
            },
        )
    with pytest.raises(AirflowFailException, match="is ABORTING"):
        op.execute_complete(context(), {"status": "failed", "message": "GKE operation x is ABORTING"})
    trigger = _deferred_trigger(create_op(deferrable=True), context())
    import asyncio

    event = asyncio.run(trigger.run().__anext__()).payload
    assert event["status"] == "success" and set(event) >= {"message", "operation_name", "resume"}
    result = create_op(deferrable=True).execute_complete(context(), event)
    assert [p["status"] for p in gke.node_pools()] == ["RUNNING"]
    assert result["created"] == [result["node_pool_name"]]  # the progress came back in the event


# --- a stuck operation: the wait has a deadline, counted from the operation's start ---------------------------
def test_a_stuck_create_fails_at_operation_timeout_and_the_teardown_deletes_the_pool_once_gke_lets_it(gke):
    queue_faults(gke, {"kind": "stuck", "seconds": 10.0})

    def create_operation() -> dict[str, Any]:
        [operation] = [o for o in gke.state()["operations"] if o["operationType"] == "CREATE_NODE_POOL"]
        return operation

    with pytest.raises(AirflowException) as err:
        create_op(operation_timeout=1.0).execute(context())
    operation = create_operation()
    assert operation["status"] == "RUNNING"  # the task stopped waiting; it did not wait the create out
    message = str(err.value)
    assert operation["name"] in message and "longer than operation_timeout (1 s)" in message
    assert "GKE cannot cancel it" in message
    # A retry keeps the deadline (the operation's start), so it fails at once too, without a second create.
    with pytest.raises(AirflowException, match="longer than operation_timeout"):
        create_op(operation_timeout=1.0).execute(context(try_number=2))
    assert create_operation()["status"] == "RUNNING"
    assert len(posts(gke)) == 1 and [p["status"] for p in gke.node_pools()] == ["PROVISIONING"]
    # The teardown waits for GKE to end the create, then deletes the pool.
    name = operation["targetLink"].rsplit("/", 1)[-1]
    result = delete_op(node_pool_name=name).execute(context(task_id="delete_pool"))
    assert result["deleted"] == [name] and gke.node_pools() == []


def test_a_deferred_wait_times_out_from_the_operations_start_and_the_task_fails_with_retries(gke):
    import asyncio

    queue_faults(gke, {"kind": "stuck", "seconds": 5.0})
    trigger = _deferred_trigger(create_op(deferrable=True, operation_timeout=0.5), context())
    assert trigger.operation_timeout == 0.5  # serialised with the trigger
    event = asyncio.run(trigger.run().__anext__()).payload
    assert event["status"] == "timeout" and "longer than operation_timeout (0.5 s)" in event["message"]
    assert [p["status"] for p in gke.node_pools()] == ["PROVISIONING"]  # it did not wait the create out
    with pytest.raises(AirflowException, match="waiting on GKE: timeout") as err:
        create_op(deferrable=True, operation_timeout=0.5).execute_complete(context(), event)
    assert not isinstance(err.value, AirflowFailException)  # a retry may find the create finished
    [name] = _statuses(gke)
    assert delete_op(node_pool_name=name).execute(context(task_id="delete_pool"))["deleted"] == [name]


REGION = "us-east5"
ZONES = ["us-east5-a", "us-east5-b", "us-east5-c"]


def regional(gke: Any) -> None:
    gke.add_cluster(f"projects/{PROJECT}/locations/{REGION}/clusters/{CLUSTER}")


def test_a_stockout_and_a_quota_error_move_the_slice_to_its_third_zone(gke):
    regional(gke)
    gke.add_fault("stockout", zone="us-east5-a", times=5)
    gke.add_fault("quota", zone="us-east5-b", times=5)
    ctx = context()
    result = create_op(location=REGION, node_zone=ZONES).execute(ctx)
    [pool] = gke.node_pools()
    assert pool["locations"] == ["us-east5-c"] and pool["status"] == "RUNNING"
    assert result["node_zone"] == "us-east5-c" and result["zone"] == {pool["name"]: "us-east5-c"}
    assert result["stockouts"] == ["on-demand in us-east5-a", "on-demand in us-east5-b"]
    creates = [r["body"]["nodePool"]["locations"] for r in posts(gke)]
    assert creates == [["us-east5-a"], ["us-east5-b"], ["us-east5-c"]]
    # a retry adopts the pool where it landed, creating nothing
    again = create_op(location=REGION, node_zone=",".join(ZONES)).execute(context(try_number=2))
    assert again["adopted"] == [pool["name"]] and again["node_zone"] == "us-east5-c" and len(posts(gke)) == 3


@pytest.mark.parametrize(
    ("order", "tried"),
    [
        ("zone-first", ["spot in us-east5-a", "spot in us-east5-b", "on-demand in us-east5-a"]),
        ("capacity-first", ["spot in us-east5-a", "on-demand in us-east5-a", "spot in us-east5-b"]),
    ],
)
def test_the_failover_order_is_the_users(gke, order, tried):
    regional(gke)
    gke.add_fault("stockout", zone="us-east5-a", times=5)  # no room in us-east5-a
    gke.add_fault("stockout", capacity="spot", times=5)  # no spot anywhere: it lands on demand in us-east5-b
    result = create_op(
        location=REGION, node_zone=ZONES[:2], capacity="spot", fallback_capacity=["on-demand"], zone_failover=order
    ).execute(context())
    assert result["stockouts"] == tried
    [pool] = gke.node_pools()
    assert (pool["locations"], result["capacity"][pool["name"]]) == (["us-east5-b"], "on-demand")


def test_every_slice_of_a_task_lands_in_one_zone(gke):
    """Slice 1 finds no room where slice 0 already runs: slice 0 is made again where both fit."""
    from tpuflow.gke.hooks import GKENodePoolHook
    from tpuflow.naming import TaskIdentity

    regional(gke)
    op = create_op(location=REGION, node_zone=ZONES[:2], tpu_slice=V5P_2X2X2_TWICE)
    plan = op.plan(TaskIdentity.from_context(context()), 2_000_000_000)
    hook = GKENodePoolHook(gcp_conn_id=CONN_ID, location=REGION)
    hook.create_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool=plan.body(0, None, "us-east5-a"))
    time.sleep(0.3)  # the stand-in's 0.2 s operation: slice 0 runs in us-east5-a
    gke.add_fault("stockout", zone="us-east5-a", times=5)
    result = op.execute(context(try_number=2))
    pools = gke.node_pools()
    assert sorted(p["locations"][0] for p in pools) == ["us-east5-b", "us-east5-b"]
    assert result["node_zone"] == "us-east5-b" and set(result["zone"].values()) == {"us-east5-b"}


def test_zones_are_checked_before_anything_is_made(gke):
    from tpuflow.errors import UserInputError

    with pytest.raises(UserInputError, match="name each zone once"):
        create_op(location=REGION, node_zone=["us-east5-a", "us-east5-a"])
    with pytest.raises(UserInputError, match="pick a zone of the cluster's region"):
        create_op(location=REGION, node_zone="us-east5-a,europe-west4-a")
    with pytest.raises(UserInputError, match="zone-first"):
        create_op(location=REGION, node_zone=ZONES, zone_failover="nearest")
    assert posts(gke) == []
