"""The hook (GKEHook's credentials and client, pointed at the stand-in by connection extras) and the
deferral triggers, against the stand-in."""

from __future__ import annotations

import asyncio
import importlib
import json
import time

import pytest
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE

from tpuflow.gke.hooks import GKENodePoolHook, GKEOperationError
from tpuflow.gke.triggers import GKENodePoolOperationTrigger, NodePoolBackoffTrigger

POOL = {"name": "np-1", "config": {"machineType": "ct6e-standard-4t"}, "initialNodeCount": 1}


def hook() -> GKENodePoolHook:
    return GKENodePoolHook(gcp_conn_id=CONN_ID, location=ZONE)


def test_the_connection_extras_select_endpoint_transport_and_anonymous_credentials(gke):
    from google.auth.credentials import AnonymousCredentials

    h = hook()
    client = h.get_cluster_manager_client()
    assert h.container_api_endpoint == gke.url and h.uses_rest_transport
    assert client.transport.kind == "rest"
    assert isinstance(h.get_credentials(), AnonymousCredentials)
    assert h.project_id == PROJECT


def test_a_grpc_transport_can_be_forced(monkeypatch):
    conn = {
        "conn_type": "google_cloud_platform",
        "extra": {"is_anonymous": True, "container_api_endpoint": "localhost:1", "container_api_transport": "grpc"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_GKE_GRPC", json.dumps(conn))
    h = GKENodePoolHook(gcp_conn_id="gke_grpc", location=ZONE)
    assert h.container_api_transport == "grpc" and not h.uses_rest_transport


def test_wait_returns_a_successful_operation_and_raises_on_operation_error(gke):
    h = hook()
    done = h.wait_for_node_pool_operation(
        h.create_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool=POOL),
        project_id=PROJECT,
        poll_interval=0.05,
    )
    assert done.status.name == "DONE" and done.target_link.endswith(f"/clusters/{CLUSTER}/nodePools/np-1")

    gke.add_fault("stockout")
    failing = h.create_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool={**POOL, "name": "np-2"})
    with pytest.raises(GKEOperationError) as err:
        h.wait_for_node_pool_operation(failing, project_id=PROJECT, poll_interval=0.05)
    assert err.value.operation.error.code == 8
    assert err.value.operation_json["nodepoolConditions"][0]["code"] == "GCE_STOCKOUT"
    assert h.get_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool_name="np-2").status.name == "ERROR"


def test_missing_pools_read_as_none(gke):
    h = hook()
    assert h.get_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool_name="absent") is None
    assert h.delete_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool_name="absent") is None


def test_find_running_operation_finds_only_unfinished_operations_on_that_pool(gke):
    h = hook()
    started = h.create_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool=POOL)
    found = h.find_running_operation(project_id=PROJECT, cluster_name=CLUSTER, node_pool_name="np-1")
    assert found is not None and found.name == started.name
    assert h.find_running_operation(project_id=PROJECT, cluster_name=CLUSTER, node_pool_name="np-10") is None
    h.wait_for_node_pool_operation(started, project_id=PROJECT, poll_interval=0.05)
    assert h.find_running_operation(project_id=PROJECT, cluster_name=CLUSTER, node_pool_name="np-1") is None


async def _first_event(trigger):
    async for event in trigger.run():
        return event
    return None


def test_the_operation_trigger_serialises_to_json_and_polls_through_the_async_hook(gke):
    operation = hook().create_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool=POOL)
    trigger = GKENodePoolOperationTrigger(
        operation_name=operation.name,
        project_id=PROJECT,
        location=ZONE,
        gcp_conn_id=CONN_ID,
        poll_interval=0.05,
        resume={"progress": {"choice": 1}, "waiting": {"operation": operation.name}},
    )
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))

    event = asyncio.run(_first_event(rebuilt))

    assert event.payload["status"] == "success" and event.payload["operation_name"] == operation.name
    assert event.payload["resume"] == {"progress": {"choice": 1}, "waiting": {"operation": operation.name}}
    assert [p["status"] for p in gke.node_pools()] == ["RUNNING"]


def test_the_backoff_trigger_wakes_at_the_given_time():
    trigger = NodePoolBackoffTrigger(wake_at=time.time() + 0.2, reason="busy", resume={"progress": {}})
    classpath, kwargs = trigger.serialize()
    assert classpath == "tpuflow.gke.triggers.NodePoolBackoffTrigger" and json.loads(json.dumps(kwargs)) == kwargs
    started = time.monotonic()
    event = asyncio.run(_first_event(trigger))
    assert time.monotonic() - started >= 0.15
    assert event.payload == {"status": "success", "message": "waited: busy", "resume": {"progress": {}}}
