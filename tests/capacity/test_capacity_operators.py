"""Queued and flex-start capacity operators against the GKE and Kubernetes stand-ins (simulated KubeRay, no Ray).

The node pool, ProvisioningRequest, flex-start and RayCluster tasks of one DAG run, executed in order
through the real hooks and clients (the Airflow connections point at the stand-ins).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from support.airflow_context import task_context
from support.dag_run import RUN, Run, RunTI
from support.gke_standin import CLUSTER, CLUSTER_PATH, CONN_ID, PROJECT, ZONE

from tpuflow.capacity.operators import (
    GKECreateProvisioningRequestOperator,
    GKEDeleteProvisioningRequestOperator,
    GKEWaitForFlexStartCapacityOperator,
)
from tpuflow.capacity.provisioning_request import CONSUME_ANNOTATION
from tpuflow.errors import UserInputError
from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator
from tpuflow.kuberay.operators import KubeRayDeleteClusterOperator
from tpuflow_rehearsal.standins.capacity import POD_TEMPLATES, PROVISIONING_REQUESTS
from tpuflow_rehearsal.standins.gke_api import GKEApiStandin
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, GkeNodePools, KubeRayStandin
from tpuflow_rehearsal.standins.kubernetes_api import EVENTS, PODS, RAYCLUSTERS

KUBE_CONN = "kube_standin"
SLICE = {"tpu_slice": {"accelerator": "v6e", "topology": "4x4"}}
FAST_POOL = {"poll_interval": 0.05, "retry_backoff": 0.05, "max_backoff": 0.2}
KUBE = {"kubernetes_conn_id": KUBE_CONN, "poll_interval": 0.05}


@pytest.fixture
def stack(gke: GKEApiStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeRayStandin]:
    gke.capacity.update({"queued": {"delaySeconds": 0.2}, "flex-start": {"delaySeconds": 0.2}})
    kube = KubeRayStandin(
        tmp_path, launcher=FakeRayLauncher(), node_pools=GkeNodePools(gke, cluster=CLUSTER_PATH), interval=0.05
    )
    with kube:
        for key, value in kube.connection_env(KUBE_CONN).items():
            monkeypatch.setenv(key, value)
        yield kube
    assert kube.capacity is not None and kube.capacity.errors == [] and kube.controller.errors == []


def pool_op(task_id: str = "create_node_pool", **kwargs: Any) -> GKECreateTPUNodePoolOperator:
    return GKECreateTPUNodePoolOperator(
        task_id=task_id, project_id=PROJECT, location=ZONE, cluster_name=CLUSTER, gcp_conn_id=CONN_ID,
        **SLICE, **FAST_POOL, **kwargs,
    )  # fmt: skip


def request_op(**kwargs: Any) -> GKECreateProvisioningRequestOperator:
    args = {"node_pool_task_id": "create_node_pool", "wait_timeout": 20, **SLICE, **KUBE, **kwargs}
    return GKECreateProvisioningRequestOperator(task_id="request_capacity", **args)


def cluster_op(provisioning_request: str | None = None) -> Any:
    from tpuflow.kuberay.operators import KubeRayCreateClusterOperator

    return KubeRayCreateClusterOperator(
        task_id="create_ray_cluster", image="rayproject/ray:2.60.0-py311", provisioning_request_name=provisioning_request,
        wait_timeout=20, **SLICE, **KUBE,
    )  # fmt: skip


def flex_op(**kwargs: Any) -> GKEWaitForFlexStartCapacityOperator:
    args = {"node_pool_task_id": "create_node_pool", "ray_cluster_task_id": "create_ray_cluster", **SLICE, **KUBE}
    return GKEWaitForFlexStartCapacityOperator(task_id="wait_for_flex_start", **{"wait_timeout": 20, **args, **kwargs})


def teardown(run: Run) -> None:
    run.execute(
        KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", **KUBE)
    )
    run.execute(
        GKEDeleteProvisioningRequestOperator(task_id="delete_request", created_by_task_id="request_capacity", **KUBE)
    )
    run.execute(
        GKEDeleteNodePoolOperator(
            task_id="delete_node_pool",
            created_by_task_id="create_node_pool",
            project_id=PROJECT,
            location=ZONE,
            cluster_name=CLUSTER,
            gcp_conn_id=CONN_ID,
            **FAST_POOL,
        )  # fmt: skip
    )


def test_queued_capacity_is_provisioned_and_the_ray_pods_consume_it(gke, stack):
    run = Run()
    pool = run.execute(pool_op(capacity="queued"))
    assert gke.node_pools()[0]["nodeCount"] == 0
    requested = run.execute(request_op(max_run_duration_seconds="3600"))
    name = requested["name"]
    assert requested["annotations"][CONSUME_ANNOTATION] == name and "provisioned" in requested["message"]
    [pr] = stack.store.list(PROVISIONING_REQUESTS)
    assert pr["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    assert pr["spec"]["parameters"] == {"maxRunDurationSeconds": "3600"}
    assert pr["spec"]["podSets"] == [{"count": 4, "podTemplateRef": {"name": name}}]
    [template] = stack.store.list(POD_TEMPLATES)
    selector = template["template"]["spec"]["nodeSelector"]
    assert selector["cloud.google.com/gke-nodepool"] == pool["node_pool_name"]
    assert selector["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert template["template"]["spec"]["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
    assert gke.node_pools()[0]["bookings"] == {name: 4}

    # A retry adopts the request instead of asking twice.
    assert run.execute(request_op(max_run_duration_seconds="3600"))["name"] == name
    assert len(stack.store.list(PROVISIONING_REQUESTS)) == 1

    run.execute(cluster_op(requested["name"]))
    workers = stack.store.list(PODS, None, "ray.io/node-type=worker")
    assert len(workers) == 4 and {p["metadata"]["annotations"][CONSUME_ANNOTATION] for p in workers} == {name}
    assert all(p["status"]["phase"] == "Running" for p in workers)
    # nothing to wait for on flex-start
    assert run.execute(flex_op())["name"] is None

    teardown(run)
    assert stack.store.list(PROVISIONING_REQUESTS) == [] and stack.store.list(POD_TEMPLATES) == []
    assert gke.node_pools() == []


def test_queued_without_capacity_fails_with_gkes_reason_at_the_deadline_and_leaves_nothing(gke, stack):
    gke.capacity.update({"queued": {"available": False, "failAfterSeconds": 600}})
    run = Run()
    run.execute(pool_op(capacity="queued"))
    with pytest.raises(AirflowException, match="CapacityIsNotFound") as err:
        run.execute(request_op(wait_timeout=1.5))
    assert "deadline" in str(err.value) and "Capacity is not found" in str(err.value)
    # the failed task withdrew its request; the teardowns find nothing left but the pool, and remove it
    assert stack.store.list(PROVISIONING_REQUESTS) == []
    teardown(run)
    assert stack.store.list(PROVISIONING_REQUESTS) == [] and stack.store.list(POD_TEMPLATES) == []
    assert stack.store.list(RAYCLUSTERS) == [] and gke.node_pools() == []


def test_a_failed_request_fails_the_task_with_gkes_reason(gke, stack):
    gke.capacity.update({"queued": {"available": False, "failAfterSeconds": 0.3}})
    run = Run()
    run.execute(pool_op(capacity="queued"))
    with pytest.raises(AirflowException, match="Failed: CapacityIsNotFound: CA could not find requested capacity"):
        run.execute(request_op())


def test_flex_start_scales_from_zero_to_the_slice_and_back(gke, stack, capfd):
    gke.capacity.update({"flex-start": {"delaySeconds": 0.6}})
    run = Run()
    run.execute(pool_op(capacity="flex-start"))
    assert gke.node_pools()[0]["nodeCount"] == 0
    assert run.execute(request_op())["name"] is None  # not queued: no ProvisioningRequest
    stack.store.create(
        RAYCLUSTERS,
        "default",
        cluster_op().build_body(task_context(RunTI(**RUN, task_id="create_ray_cluster")), "default"),
    )
    waited = run.execute(flex_op(poll_interval=0.1))
    assert "flex-start capacity arrived" in waited["message"]
    logged = capfd.readouterr().out  # the task log
    assert "waiting for flex-start capacity: 0/4 TPU pod(s) scheduled" in logged and "s elapsed" in logged
    assert any(e["reason"] == "TriggeredScaleUp" for e in stack.store.list(EVENTS, "default"))
    assert gke.node_pools()[0]["nodeCount"] == 4
    run.execute(cluster_op())  # adopts the RayCluster and finds it ready
    teardown(run)
    assert gke.node_pools() == []


def test_flex_start_pool_goes_back_to_zero_when_the_ray_cluster_is_deleted(gke, stack):
    run = Run()
    run.execute(pool_op(capacity="flex-start"))
    run.execute(cluster_op())
    assert gke.node_pools()[0]["nodeCount"] == 4
    run.execute(
        KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", **KUBE)
    )
    import time

    deadline = time.monotonic() + 10
    while gke.node_pools()[0]["nodeCount"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gke.node_pools()[0]["nodeCount"] == 0


def test_flex_start_without_capacity_fails_with_the_autoscalers_reason(gke, stack):
    gke.capacity.update({"flex-start": {"available": False}})
    run = Run()
    run.execute(pool_op(capacity="flex-start"))
    stack.store.create(
        RAYCLUSTERS,
        "default",
        cluster_op().build_body(task_context(RunTI(**RUN, task_id="create_ray_cluster")), "default"),
    )
    with pytest.raises(AirflowException, match="no flex-start capacity after") as err:
        run.execute(flex_op(wait_timeout=1.5, poll_interval=0.1))
    assert "NotTriggerScaleUp" in str(err.value) and "GCE_STOCKOUT" in str(err.value)


def test_a_fallback_chain_ending_in_flex_start_completes(gke, stack):
    gke.add_fault("stockout", capacity="spot")
    run = Run()
    pool = run.execute(pool_op(capacity="spot", fallback_capacity=["flex-start"]))
    assert set(pool["capacity"].values()) == {"flex-start"} and pool["stockouts"] == ["spot"]
    assert run.execute(request_op())["name"] is None
    run.execute(cluster_op())
    assert "flex-start capacity arrived" in run.execute(flex_op())["message"]
    teardown(run)
    assert gke.node_pools() == []


@pytest.mark.parametrize("value", [0, -5, 604801, "1h", 2.5, True])
def test_bad_max_run_duration_fails_before_anything_is_created(gke, stack, value):
    with pytest.raises(UserInputError) as static:
        request_op(max_run_duration_seconds=value)  # a static value: the DAG file does not import
    assert static.value.field == "max_run_duration_seconds" and "604800" in static.value.fix
    templated = request_op(node_pool_name="some-pool", node_pool_task_id=None, max_run_duration_seconds="{{ x }}")
    templated.max_run_duration_seconds = value  # as rendered
    with pytest.raises(UserInputError, match="max_run_duration_seconds"):
        templated.execute(task_context(RunTI(**RUN, task_id="request_capacity")))
    assert stack.store.list(PROVISIONING_REQUESTS) == [] and stack.store.list(POD_TEMPLATES) == []


def test_the_wait_runs_deferred_in_a_trigger(gke, stack):
    from tpuflow.capacity.triggers import ProvisioningRequestTrigger

    run = Run()
    run.execute(pool_op(capacity="queued"))
    op = request_op(deferrable=True)
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        run.execute(op)
    trigger = deferred.value.trigger
    classpath, kwargs = trigger.serialize()
    assert classpath == "tpuflow.capacity.triggers.ProvisioningRequestTrigger"
    revived = ProvisioningRequestTrigger(**kwargs)

    async def first_event() -> Any:
        return await anext(revived.run())

    event = asyncio.run(first_event()).payload
    assert event["status"] == "success"
    result = op.execute_complete(task_context(RunTI(**RUN, task_id="request_capacity")), event)
    assert result["name"] == kwargs["name"] and result["annotations"][CONSUME_ANNOTATION] == kwargs["name"]

    # Killing the deferred task (marked failed, cleared) withdraws the request and its PodTemplate.
    assert stack.store.list(PROVISIONING_REQUESTS) and stack.store.list(POD_TEMPLATES)
    asyncio.run(revived.on_kill())
    assert stack.store.list(PROVISIONING_REQUESTS) == [] and stack.store.list(POD_TEMPLATES) == []


def first_event(trigger: Any) -> dict[str, Any]:
    """What the triggerer would hand back: the trigger's first event, run under asyncio."""

    async def first() -> Any:
        return await anext(trigger.run())

    return asyncio.run(first()).payload


def defer_flex_start(gke: GKEApiStandin, stack: KubeRayStandin, **kwargs: Any) -> tuple[Run, Any, dict[str, Any]]:
    """A flex-start pool, the RayCluster's pending TPU pods, and the flex-start wait deferred: (run, op, kwargs)."""
    from tpuflow.capacity.triggers import FlexStartCapacityTrigger

    run = Run()
    run.execute(pool_op(capacity="flex-start"))
    assert gke.node_pools()[0]["nodeCount"] == 0
    stack.store.create(
        RAYCLUSTERS,
        "default",
        cluster_op().build_body(task_context(RunTI(**RUN, task_id="create_ray_cluster")), "default"),
    )
    op = flex_op(deferrable=True, **kwargs)
    with pytest.raises(TaskDeferred) as deferred:
        run.execute(op)
    assert deferred.value.method_name == "execute_complete"
    trigger = deferred.value.trigger
    assert isinstance(trigger, FlexStartCapacityTrigger)
    classpath, trigger_kwargs = trigger.serialize()
    assert classpath == "tpuflow.capacity.triggers.FlexStartCapacityTrigger"
    # what the triggerer stores and rebuilds from: plain JSON
    assert json.loads(json.dumps(trigger_kwargs)) == trigger_kwargs
    assert trigger_kwargs["expected_pods"] == 4 and "ray.io/node-type=worker" in trigger_kwargs["label_selector"]
    return run, op, trigger_kwargs


def assert_nothing_left(gke: GKEApiStandin, stack: KubeRayStandin) -> None:
    assert gke.node_pools() == [] and stack.store.list(RAYCLUSTERS) == []
    assert stack.store.list(PROVISIONING_REQUESTS) == [] and stack.store.list(POD_TEMPLATES) == []


def test_the_flex_start_wait_runs_deferred_in_a_trigger(gke, stack):
    from tpuflow.capacity.triggers import FlexStartCapacityTrigger

    run, op, kwargs = defer_flex_start(gke, stack)
    event = first_event(FlexStartCapacityTrigger(**kwargs))
    assert event["status"] == "success" and "flex-start capacity arrived" in event["message"]
    assert "4 TPU pod(s) scheduled" in event["message"]
    assert gke.node_pools()[0]["nodeCount"] == 4  # the autoscaler grew the pool for the pending pods
    assert any(e["reason"] == "TriggeredScaleUp" for e in stack.store.list(EVENTS, "default"))
    result = op.execute_complete(task_context(RunTI(**RUN, task_id="wait_for_flex_start")), event)
    assert result == {"message": event["message"]}

    teardown(run)
    assert_nothing_left(gke, stack)


def test_the_deferred_flex_start_wait_without_capacity_fails_with_the_autoscalers_reason(gke, stack):
    from tpuflow.capacity.triggers import FlexStartCapacityTrigger

    gke.capacity.update({"flex-start": {"available": False}})
    run, op, kwargs = defer_flex_start(gke, stack, wait_timeout=1.5, poll_interval=0.1)
    event = first_event(FlexStartCapacityTrigger(**kwargs))
    assert event["status"] == "timeout"
    assert "no flex-start capacity after" in event["message"] and "0/4 TPU pod(s) scheduled" in event["message"]
    with pytest.raises(AirflowException, match="Waiting for flex-start TPU capacity: timeout: no flex-start") as err:
        op.execute_complete(task_context(RunTI(**RUN, task_id="wait_for_flex_start")), event)
    assert "NotTriggerScaleUp" in str(err.value) and "GCE_STOCKOUT" in str(err.value)
    assert not isinstance(err.value, AirflowFailException)  # a retry may find capacity
    assert gke.node_pools()[0]["nodeCount"] == 0

    teardown(run)
    assert_nothing_left(gke, stack)


def test_capacity_revoked_before_the_trigger_looks_fails_the_task_with_gkes_reason_and_withdraws_it(gke, stack):
    """The stand-in revokes a request's nodes maxRunDurationSeconds after provisioning them. The wait
    returns at Provisioned=True, so only a trigger that first polls after that (a busy triggerer) sees
    CapacityRevoked: the final condition wins over Provisioned=True and the task fails with GKE's reason."""
    from tpuflow.capacity.triggers import ProvisioningRequestTrigger

    run = Run()
    run.execute(pool_op(capacity="queued"))
    op = request_op(deferrable=True, max_run_duration_seconds="1")
    with pytest.raises(TaskDeferred) as deferred:
        run.execute(op)
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "tpuflow.capacity.triggers.ProvisioningRequestTrigger"
    name = kwargs["name"]

    def conditions() -> dict[str, dict[str, Any]]:
        pr = stack.store.find(PROVISIONING_REQUESTS, "default", name) or {}
        return {c["type"]: c for c in (pr.get("status") or {}).get("conditions") or []}

    deadline = time.monotonic() + 10
    while "CapacityRevoked" not in conditions() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert conditions()["Provisioned"]["status"] == "True" and conditions()["CapacityRevoked"]["status"] == "True"
    assert gke.node_pools()[0]["nodeCount"] == 0  # the nodes went back

    event = first_event(ProvisioningRequestTrigger(**kwargs))
    reason = "CapacityRevoked: MaxRunDurationReached: The nodes ran for maxRunDurationSeconds (1) and were removed"
    assert event["status"] == "failed" and event["message"] == f"ProvisioningRequest default/{name}: {reason}"
    assert event["retryable"] is True
    with pytest.raises(AirflowException) as err:
        op.execute_complete(task_context(RunTI(**RUN, task_id="request_capacity")), event)
    assert str(err.value) == f"Waiting for queued TPU capacity: failed: ProvisioningRequest default/{name}: {reason}"
    assert not isinstance(err.value, AirflowFailException)  # capacity may come back: a retry asks again
    # the failed task withdrew its request and PodTemplate
    assert stack.store.list(PROVISIONING_REQUESTS) == [] and stack.store.list(POD_TEMPLATES) == []

    teardown(run)
    assert_nothing_left(gke, stack)


class ScriptedRequests:
    """A capacity reader whose ProvisioningRequest goes through the given states (the last one stays)."""

    def __init__(self, *states: dict[str, Any]) -> None:
        self.states, self.reads = list(states), 0

    async def get_provisioning_request(self, name: str, namespace: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.states[min(self.reads, len(self.states)) - 1]


def request_with(*conditions: tuple[str, str, str, str]) -> dict[str, Any]:
    keys = ("type", "status", "reason", "message")
    return {
        "metadata": {"name": "req"},
        "status": {"conditions": [dict(zip(keys, c, strict=True)) for c in conditions]},
    }


@pytest.mark.parametrize(
    ("kind", "reason", "message"),
    [
        ("CapacityRevoked", "MaxRunDurationReached", "The nodes ran for maxRunDurationSeconds (3600) and were removed"),
        ("BookingExpired", "BookingExpired", "Capacity booking expired: no pods consumed the nodes in time"),
    ],
)
def test_a_request_revoked_or_expired_while_waiting_fails_with_gkes_reason(kind, reason, message):
    import logging

    from tpuflow.capacity.triggers import wait_provisioned

    accepted = ("Accepted", "True", "Accepted", "ProvisioningRequest is accepted")
    waiting = ("Provisioned", "False", "CapacityIsNotFound", "Capacity is not found, CA will try to find it later.")
    reader = ScriptedRequests(
        request_with(accepted, waiting), request_with(accepted, waiting, (kind, "True", reason, message))
    )
    event = asyncio.run(
        wait_provisioned(
            reader,
            name="req",
            namespace="ml",
            deadline=time.time() + 10,
            poll_interval=0.01,
            started_at=time.time(),
            log=logging.getLogger("test"),
        )
    )
    assert reader.reads == 2  # it kept waiting through Provisioned=False, and stopped at the final condition
    assert event == {
        "status": "failed",
        "message": f"ProvisioningRequest ml/req: {kind}: {reason}: {message}",
        "name": "req",
        "retryable": True,
    }
    op = request_op(deferrable=True)
    with pytest.raises(AirflowException) as err:  # nothing described in the event: nothing to delete
        op.execute_complete(task_context(RunTI(**RUN, task_id="request_capacity")), event)
    assert (
        str(err.value)
        == f"Waiting for queued TPU capacity: failed: ProvisioningRequest ml/req: {kind}: {reason}: {message}"
    )


# --- the pure parts: request bodies, the annotations, the pipeline's Param check ------------------------
def test_one_pod_set_per_slice_and_pool_with_the_slices_selector_and_chips():
    from tpuflow.capacity.provisioning_request import plan_provisioning_request
    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec("v6e", "4x4", num_slices=2)
    plan = plan_provisioning_request(tpu=tpu, node_pools=["pool-a", "pool-b"], name="req", namespace="ml")
    body = plan.provisioning_request()
    assert body["apiVersion"] == "autoscaling.x-k8s.io/v1" and "parameters" not in body["spec"]  # GKE's default
    assert body["spec"]["podSets"] == [
        {"count": 4, "podTemplateRef": {"name": "req-s0"}},
        {"count": 4, "podTemplateRef": {"name": "req-s1"}},
    ]
    pools = [t["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"] for t in plan.pod_templates()]
    assert pools == ["pool-a", "pool-b"] and plan.describe()["nodes"] == 8
    with pytest.raises(UserInputError, match="2 node pool"):
        plan_provisioning_request(tpu=tpu, node_pools=["pool-a"], name="req", namespace="ml")


@pytest.mark.parametrize(("value", "seconds"), [(None, None), ("", None), (1, 1), ("3600", 3600), (604800, 604800)])
def test_max_run_duration_accepts_gkes_range(value, seconds):
    from tpuflow.capacity.provisioning_request import check_max_run_duration

    assert check_max_run_duration(value) == seconds


def test_ray_pods_consume_the_request_only_when_named():
    from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest
    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec("v6e", "4x4")
    plain = raycluster_manifest(RayClusterTemplate(tpu=tpu, image="ray:x"), name="rc")
    queued = raycluster_manifest(RayClusterTemplate(tpu=tpu, image="ray:x", provisioning_request="req-1"), name="rc")
    [worker] = queued["spec"]["workerGroupSpecs"]
    assert worker["template"]["metadata"]["annotations"] == {
        "autoscaling.x-k8s.io/consume-provisioning-request": "req-1",
        "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io",
    }
    assert "annotations" not in (plain["spec"]["workerGroupSpecs"][0]["template"].get("metadata") or {})
    assert "annotations" not in (queued["spec"]["headGroupSpec"]["template"].get("metadata") or {})
    with pytest.raises(UserInputError, match="provisioning_request"):
        RayClusterTemplate(tpu=tpu, image="ray:x", provisioning_request="Not A Name").validated()


def test_the_pipeline_checks_max_run_duration_with_its_params():
    from tpuflow.pipeline.gke import check_gke_params

    base = {"accelerator": "TPU-V6E", "topology": "2x2", "framework": "jax", "accuracy_threshold": 0.9}
    assert check_gke_params({**base, "max_run_duration_seconds": 3600})["topology"] == "2x2"
    with pytest.raises(UserInputError) as err:
        check_gke_params({**base, "max_run_duration_seconds": 604801})
    assert err.value.field == "params.max_run_duration_seconds" and "604800" in err.value.fix


def test_a_templated_tpu_slice_is_rendered_and_resolved_when_the_task_runs():
    from tpuflow.tpu import TpuSlice

    templated = {"accelerator": "{{ params.acc }}", "topology": "{{ params.topo }}", "num_slices": "{{ params.n }}"}
    op = request_op(tpu_slice=templated, node_pool_name=["pool-a", "pool-b"], node_pool_task_id=None)
    assert op.tpu_slice is templated  # not checked before rendering
    op.render_template_fields({"params": {"acc": "v6e", "topo": "4x4", "n": "2"}})
    assert op.resolved_slice() == TpuSlice.from_spec("v6e", "4x4", num_slices=2)
    assert op.plan(None, "ml").describe()["nodes"] == 8  # two 4-host slices, one pool each

    flex = flex_op(tpu_slice=dict(templated))
    flex.render_template_fields({"params": {"acc": "v6e", "topo": "16", "n": "1"}})
    with pytest.raises(UserInputError) as err:  # checked first thing in execute, before any Kubernetes call
        flex.execute(task_context(RunTI(**RUN, task_id="wait_for_flex_start")))
    assert err.value.field == "tpu_slice.topology" and "not a chip count" in err.value.fix


def test_the_old_slice_kwargs_are_refused_and_a_static_bad_slice_fails_at_parse_time():
    with pytest.raises(TypeError, match="(?s)Invalid arguments.*'accelerator': 'v6e'"):
        GKECreateProvisioningRequestOperator(
            task_id="request_capacity", accelerator="v6e", topology="4x4", node_pool_name="pool-a", **KUBE
        )
    with pytest.raises(UserInputError) as err:
        request_op(tpu_slice={"accelerator": "v6e"})
    assert err.value.field == "tpu_slice.topology"


def test_a_templated_request_name_waits_for_rendering_and_a_static_bad_one_fails_at_parse_time():
    op = request_op(name="{{ params.request }}")  # the plan reads the name: not checked before rendering
    op.name = "Bad_Name"  # what the template rendered to
    with pytest.raises(UserInputError) as err:
        op.validate_arguments()
    assert err.value.field == "name"
    with pytest.raises(UserInputError, match="name='Bad_Name'"):
        request_op(name="Bad_Name")


def test_killing_the_request_while_it_waits_in_the_worker_withdraws_it(gke, stack):
    """on_kill cleans up self._owned: set while this worker waits on the request it created, None before and after."""
    import threading
    import time

    gke.capacity.update({"queued": {"available": False, "failAfterSeconds": 600}})
    run = Run()
    run.execute(pool_op(capacity="queued"))
    op = request_op(wait_timeout=5)
    assert op._owned is None
    failed: list[BaseException] = []

    def work() -> None:
        try:
            run.execute(op)
        except Exception as err:  # the wait runs on after the kill here; in Airflow SIGKILL ends it
            failed.append(err)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while op._owned is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    namespace, name, templates = op._owned
    assert [r["metadata"]["name"] for r in stack.store.list(PROVISIONING_REQUESTS)] == [name]
    op.on_kill()  # what the task runner's SIGTERM handler calls
    assert stack.store.list(PROVISIONING_REQUESTS) == [] and stack.store.list(POD_TEMPLATES) == []
    worker.join(timeout=15)
    assert op._owned is None and failed  # the withdrawn request never got its nodes
    teardown(run)
