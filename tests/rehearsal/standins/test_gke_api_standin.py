"""The GKE API stand-in, driven by the real google-cloud-container client over REST (no Airflow)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.container_v1 import ClusterManagerClient, NodePool

from tpuflow_rehearsal.standins.gke_api import GKEApiStandin

PARENT = "projects/p-123456/locations/us-east5-b/clusters/c1"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def standin() -> Iterator[GKEApiStandin]:
    with GKEApiStandin(operation_seconds=0.2, workload_policies={"wp-2x2x2": "2x2x2"}) as gke:
        yield gke


@pytest.fixture
def client(standin: GKEApiStandin) -> ClusterManagerClient:
    return ClusterManagerClient(
        credentials=AnonymousCredentials(), transport="rest", client_options=ClientOptions(api_endpoint=standin.url)
    )


def pool(name: str = "np", machine: str = "ct6e-standard-4t", nodes: int = 4, **extra: Any) -> NodePool:
    body: dict[str, Any] = {"name": name, "config": {"machineType": machine}, "initialNodeCount": nodes, **extra}
    return NodePool.from_json(json.dumps(body))


def compact(topology: str) -> dict[str, Any]:
    return {"placementPolicy": {"type": "COMPACT", "tpuTopology": topology}}


def wait_done(client: ClusterManagerClient, operation: Any) -> Any:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        current = client.get_operation(name=f"projects/p-123456/locations/us-east5-b/operations/{operation.name}")
        if current.status.name == "DONE":
            return current
        time.sleep(0.05)
    raise AssertionError("operation did not finish")


def call(standin: GKEApiStandin, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        standin.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def test_create_get_delete_lifecycle_takes_the_configured_time(client, standin):
    started = time.monotonic()
    op = client.create_node_pool(parent=PARENT, node_pool=pool(**compact("4x4")))
    assert op.status.name == "RUNNING" and op.operation_type.name == "CREATE_NODE_POOL"
    assert client.get_node_pool(name=f"{PARENT}/nodePools/np").status.name == "PROVISIONING"
    wait_done(client, op)
    assert time.monotonic() - started >= 0.2
    assert client.get_node_pool(name=f"{PARENT}/nodePools/np").status.name == "RUNNING"
    assert [p.name for p in client.list_node_pools(parent=PARENT).node_pools] == ["np"]

    delete = client.delete_node_pool(name=f"{PARENT}/nodePools/np")
    assert client.get_node_pool(name=f"{PARENT}/nodePools/np").status.name == "STOPPING"
    wait_done(client, delete)
    with pytest.raises(exceptions.NotFound):
        client.get_node_pool(name=f"{PARENT}/nodePools/np")


@pytest.mark.parametrize(
    ("node_pool", "message"),
    [
        (pool(machine="ct6e-standard-8t", **compact("4x4")), "cannot form TPU topology 4x4"),
        (pool(nodes=1, **compact("2x2")), "Placement policy is not supported for single-host"),
        (pool(machine="ct6e-standard-8t", nodes=1, **compact("2x4")), "Placement policy is not supported for single"),
        (pool(nodes=3, **compact("4x4")), "a multi-host TPU slice node pool has exactly 4 nodes"),
        (pool(nodes=1, placementPolicy={"type": "COMPACT"}), "COMPACT without tpuTopology is not supported"),
        (pool(machine="ct6e-standard-3t", nodes=1), 'Machine type "ct6e-standard-3t" does not exist'),
        (pool(machine="tpu7x-standard-4t", nodes=2, **compact("2x2x2")), "placed with a workload policy"),
        (
            pool(machine="ct5p-hightpu-4t", nodes=2, placementPolicy={"policyName": "wp-2x2x2"}),
            "policyName is not supported for",
        ),
        (pool(machine="tpu7x-standard-4t", nodes=2, placementPolicy={"policyName": "nope"}), '"nope" was not found'),
        (pool(name="Bad_Name"), "Invalid node pool name"),
        (pool(**compact("3x3")), 'Invalid TPU topology "3x3"'),
        (
            pool(
                nodes=0,
                config={"machineType": "ct6e-standard-4t", "flexStart": True, "maxRunDuration": "700000s"},
                autoscaling={"enabled": True, "maxNodeCount": 4},
                **compact("4x4"),
            ),
            "exceeds the 604800s",
        ),
    ],
)
def test_requests_gke_would_reject_are_rejected(client, node_pool, message):
    with pytest.raises(exceptions.BadRequest, match=message):
        client.create_node_pool(parent=PARENT, node_pool=node_pool)


def test_nodes_are_deleted_once_they_ran_for_the_pools_max_run_duration(client, standin):
    """GKE's own hard stop: nothing else (Airflow, the reaper) needs to be up for the nodes to go."""
    body = pool(config={"machineType": "ct6e-standard-4t", "maxRunDuration": "1s"}, **compact("4x4"))
    wait_done(client, client.create_node_pool(parent=PARENT, node_pool=body))
    (running,) = standin.node_pools()
    assert running["nodeCount"] == 4 and running["config"]["maxRunDuration"] == "1s"
    time.sleep(1.2)
    (expired,) = standin.node_pools()
    assert expired["nodeCount"] == 0 and "ran for maxRunDuration (1s)" in expired["statusMessage"]
    # the pool stays (a teardown deletes it), with no node to bill or to schedule on
    assert standin.find_node_pools({"cloud.google.com/gke-tpu-topology": "4x4"}, 4) == []
    wait_done(client, client.delete_node_pool(name=f"{PARENT}/nodePools/np"))
    assert standin.node_pools() == []


def test_valid_tpu_shapes_are_accepted(client):
    client.create_node_pool(parent=PARENT, node_pool=pool("v6e-single", nodes=3))  # 3 single-host 2x2 slices
    client.create_node_pool(parent=PARENT, node_pool=pool("v5e-2x4", "ct5lp-hightpu-4t", 2, **compact("2x4")))
    client.create_node_pool(
        parent=PARENT, node_pool=pool("tpu7x", "tpu7x-standard-4t", 2, placementPolicy={"policyName": "wp-2x2x2"})
    )
    client.create_node_pool(parent=PARENT, node_pool=pool("cpu", "n2-standard-8", 2))


def test_unknown_fields_are_rejected_like_gke(standin):
    with pytest.raises(urllib.error.HTTPError) as err:
        call(standin, "POST", f"/v1/{PARENT}/nodePools", {"nodePool": {"name": "np", "tpuTopology": "4x4"}})
    assert err.value.code == 400
    assert "Invalid JSON payload" in json.load(err.value)["error"]["message"]


def test_duplicates_missing_pools_and_busy_pools_answer_like_gke(client):
    client.create_node_pool(parent=PARENT, node_pool=pool(**compact("4x4")))
    with pytest.raises(exceptions.Conflict, match="Already exists"):
        client.create_node_pool(parent=PARENT, node_pool=pool(**compact("4x4")))
    with pytest.raises(exceptions.BadRequest, match="is currently creating node pool np.*Please wait and try again"):
        client.delete_node_pool(name=f"{PARENT}/nodePools/np")
    with pytest.raises(exceptions.NotFound, match="Not found"):
        client.delete_node_pool(name=f"{PARENT}/nodePools/other")


def test_update_replaces_the_resource_labels_when_its_operation_is_done(client, standin):
    """nodePools.update with resourceLabels, as the client sends it (PUT, an UpdateNodePoolRequest body): an
    UPGRADE_NODES operation; the whole new set replaces the old one once it is done; the pool keeps serving."""
    from google.cloud.container_v1.types import ResourceLabels, UpdateNodePoolRequest

    name = f"{PARENT}/nodePools/np"
    labels = {"team": "ml", "tpuflow-expires": "1700000000"}
    wait_done(client, client.create_node_pool(parent=PARENT, node_pool=pool(nodes=1, config={
        "machineType": "ct6e-standard-1t", "resourceLabels": labels})))  # fmt: skip
    op = client.update_node_pool(
        request=UpdateNodePoolRequest(name=name, resource_labels=ResourceLabels(labels={"team": "ml", "kept": "true"}))
    )
    assert op.status.name == "RUNNING" and op.operation_type.name == "UPGRADE_NODES"
    assert op.target_link.endswith("/clusters/c1/nodePools/np")
    assert client.get_node_pool(name=name).status.name == "RUNNING"  # relabelled in place
    assert dict(client.get_node_pool(name=name).config.resource_labels) == labels
    # one operation at a time on a pool, as for deletes
    with pytest.raises(exceptions.BadRequest, match="is currently updating node pool np.*Please wait"):
        client.delete_node_pool(name=name)
    assert wait_done(client, op).error.code == 0
    assert dict(client.get_node_pool(name=name).config.resource_labels) == {"team": "ml", "kept": "true"}
    [sent] = [r for r in standin.requests if r["method"] == "PUT"]
    assert sent["path"] == f"/v1/{name}"
    assert sent["body"]["resourceLabels"] == {"labels": {"team": "ml", "kept": "true"}}
    with pytest.raises(exceptions.NotFound, match="Not found"):
        client.update_node_pool(
            request=UpdateNodePoolRequest(name=f"{PARENT}/nodePools/other", resource_labels=ResourceLabels(labels={}))
        )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"resourceLabels": {"labels": {"Team": "ml"}}}, 'Invalid resourceLabels entry "Team"'),
        ({"resourceLabels": {"labels": {"team": "ML"}}}, 'Invalid resourceLabels entry "team"'),
        ({"resourceLabels": {"labels": {}}, "nodeVersion": "1.34"}, "updates only resourceLabels.*nodeVersion"),
        ({"labels": {"labels": {"a": "b"}}}, "updates only resourceLabels.*labels"),
        ({"resourceLabel": {"labels": {}}}, "Invalid JSON payload"),  # unknown field
        ({}, "At least one field must be updated"),
    ],
)
def test_updates_gke_or_the_standin_would_not_serve_are_400s(client, standin, body, message):
    wait_done(client, client.create_node_pool(parent=PARENT, node_pool=pool(nodes=1, machine="ct6e-standard-1t")))
    with pytest.raises(urllib.error.HTTPError) as err:
        call(standin, "PUT", f"/v1/{PARENT}/nodePools/np", body)
    assert err.value.code == 400
    assert re.search(message, json.load(err.value)["error"]["message"]), message


def test_the_cluster_concurrency_limit_answers_429(client, standin):
    standin.max_concurrent_operations = 2
    client.create_node_pool(parent=PARENT, node_pool=pool("a", nodes=1))
    client.create_node_pool(parent=PARENT, node_pool=pool("b", nodes=1))
    with pytest.raises(exceptions.TooManyRequests, match='cluster "c1" hits the concurrent operations quota 2'):
        client.create_node_pool(parent=PARENT, node_pool=pool("c", nodes=1))


def test_faults_queued_over_http_fail_the_next_matching_creates(client, standin):
    call(
        standin,
        "POST",
        "/_standin/faults",
        {
            "faults": [
                {"kind": "stockout", "capacity": "spot"},
                {"kind": "permission", "capacity": "on-demand"},
            ]
        },
    )
    with pytest.raises(exceptions.Forbidden, match="container.clusters.update"):
        client.create_node_pool(parent=PARENT, node_pool=pool("od", nodes=1))
    spot = client.create_node_pool(
        parent=PARENT, node_pool=pool("sp", nodes=1, config={"machineType": "ct6e-standard-4t", "spot": True})
    )
    failed = wait_done(client, spot)
    assert failed.error.code == 8 and "does not have enough resources" in failed.error.message
    assert failed.nodepool_conditions[0].code.name == "GCE_STOCKOUT"
    assert client.get_node_pool(name=f"{PARENT}/nodePools/sp").status.name == "ERROR"
    assert call(standin, "GET", "/_standin/faults") == {"faults": []}
    # Faults are used up: the next create works.
    wait_done(client, client.create_node_pool(parent=PARENT, node_pool=pool("od", nodes=1)))


def test_a_stuck_create_holds_its_pool_busy_for_its_seconds_then_succeeds(client, standin):
    call(standin, "POST", "/_standin/faults", {"kind": "stuck", "seconds": 1.0})
    op = client.create_node_pool(parent=PARENT, node_pool=pool("slow", nodes=1))
    time.sleep(0.5)  # longer than the stand-in's operation_seconds: an unstuck create would be done
    assert (
        client.get_operation(name=f"projects/p-123456/locations/us-east5-b/operations/{op.name}").status.name
        == "RUNNING"
    )
    with pytest.raises(exceptions.BadRequest, match=f"Operation {op.name} is currently creating node pool slow"):
        client.delete_node_pool(name=f"{PARENT}/nodePools/slow")
    done = wait_done(client, op)
    assert not done.error.message and client.get_node_pool(name=f"{PARENT}/nodePools/slow").status.name == "RUNNING"


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"kind": "stuck", "on": "delete"}, "use on create, stage operation"),
        ({"kind": "stuck", "stage": "request"}, "use on create, stage operation"),
        ({"kind": "internal", "seconds": 5}, "only a stuck fault takes seconds"),
        ({"kind": "stuck", "seconds": -1}, "a finite number >= 0"),
    ],
)
def test_a_stuck_fault_is_refused_where_it_means_nothing(standin, fault, message):
    with pytest.raises(ValueError, match=message):
        standin.add_fault(**fault)


def test_node_labels_and_the_match_query(client, standin):
    wait_done(
        client,
        client.create_node_pool(
            parent=PARENT,
            node_pool=pool(
                "slice", **compact("4x4"), config={"machineType": "ct6e-standard-4t", "labels": {"team": "ml"}}
            ),
        ),
    )
    wait_done(client, client.create_node_pool(parent=PARENT, node_pool=pool("small", nodes=1)))
    selector = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "4x4"}

    [match] = call(standin, "POST", "/_standin/match", {"nodeSelector": selector, "nodes": 4})["matches"]
    assert match["name"] == "slice" and match["nodeCount"] == 4 and match["cluster"] == PARENT
    assert match["labels"]["cloud.google.com/gke-nodepool"] == "slice" and match["labels"]["team"] == "ml"
    assert call(standin, "POST", "/_standin/match", {"nodeSelector": selector, "nodes": 5})["matches"] == []
    # A single-host 4-chip v6e node is labelled with its own 2x2 topology.
    [small] = standin.find_node_pools({"cloud.google.com/gke-tpu-topology": "2x2"})
    assert small["name"] == "small"


def test_only_loopback_addresses_are_bound():
    with pytest.raises(ValueError, match="loopback"):
        GKEApiStandin(host="0.0.0.0")


def test_it_starts_from_a_shell_and_prints_its_url():
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuflow_rehearsal.standins.gke_api", "--port", "0", "--operation-seconds", "0.1"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "/_standin/health", timeout=5) as response:
            assert json.load(response) == {"status": "ok"}
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
