"""The Compute resource-policy stand-in (served by the GKE stand-in), driven by the real
google-cloud-compute client over REST, and the GKE stand-in's check of a pool's workload policy."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from google.cloud.container_v1 import ClusterManagerClient, NodePool

from tpuflow_rehearsal.standins.gke_api import GKEApiStandin

PROJECT, REGION = "p-123456", "us-east5"
PARENT = f"projects/{PROJECT}/locations/{REGION}-b/clusters/c1"


@pytest.fixture
def standin() -> Iterator[GKEApiStandin]:
    with GKEApiStandin(operation_seconds=0.1) as gke:
        yield gke


def _options(standin: GKEApiStandin) -> dict[str, Any]:
    return {
        "credentials": AnonymousCredentials(),
        "transport": "rest",
        "client_options": ClientOptions(api_endpoint=standin.url),
    }


@pytest.fixture
def policies(standin: GKEApiStandin) -> compute_v1.ResourcePoliciesClient:
    return compute_v1.ResourcePoliciesClient(**_options(standin))


@pytest.fixture
def operations(standin: GKEApiStandin) -> compute_v1.RegionOperationsClient:
    return compute_v1.RegionOperationsClient(**_options(standin))


def workload(name: str, kind: str = "HIGH_THROUGHPUT", topology: str | None = "2x2x2") -> compute_v1.ResourcePolicy:
    policy: dict[str, Any] = {"type": kind}
    if topology is not None:
        policy["acceleratorTopology"] = topology
    return compute_v1.ResourcePolicy.from_json(json.dumps({"name": name, "workloadPolicy": policy}))


def insert_and_wait(policies: Any, operations: Any, body: Any, region: str = REGION) -> Any:
    operation = policies.insert_unary(project=PROJECT, region=region, resource_policy_resource=body)
    assert operation.status == compute_v1.Operation.Status.RUNNING and operation.operation_type == "insert"
    done = operations.wait(project=PROJECT, region=region, operation=operation.name)
    assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors
    return done


def test_insert_get_list_delete_with_regional_operations(policies, operations):
    operation = policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=workload("wp-a"))
    # Not there until its operation is done, like Compute.
    with pytest.raises(exceptions.NotFound):
        policies.get(project=PROJECT, region=REGION, resource_policy="wp-a")
    deadline = time.monotonic() + 10
    while operations.get(project=PROJECT, region=REGION, operation=operation.name).status.name != "DONE":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    got = policies.get(project=PROJECT, region=REGION, resource_policy="wp-a")
    assert got.workload_policy.type_ == "HIGH_THROUGHPUT" and got.workload_policy.accelerator_topology == "2x2x2"
    assert got.status == "READY" and got.self_link.endswith(f"/regions/{REGION}/resourcePolicies/wp-a")
    assert [p.name for p in policies.list(project=PROJECT, region=REGION)] == ["wp-a"]
    assert list(policies.list(project=PROJECT, region="europe-west4")) == []

    deleting = policies.delete_unary(project=PROJECT, region=REGION, resource_policy="wp-a")
    assert deleting.operation_type == "delete"
    operations.wait(project=PROJECT, region=REGION, operation=deleting.name)
    with pytest.raises(exceptions.NotFound, match="resourcePolicies/wp-a' was not found"):
        policies.get(project=PROJECT, region=REGION, resource_policy="wp-a")
    with pytest.raises(exceptions.NotFound):
        policies.delete_unary(project=PROJECT, region=REGION, resource_policy="wp-a")


def test_a_duplicate_name_is_409_even_while_its_insert_runs(policies, operations):
    policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=workload("wp-b"))
    with pytest.raises(exceptions.Conflict, match="already exists"):
        policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=workload("wp-b"))
    # Another region is another namespace.
    insert_and_wait(policies, operations, workload("wp-b"), region="europe-west4")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (workload("wp-c", kind="COMPACT"), "resource.workloadPolicy.type': 'COMPACT'"),
        (workload("wp-c", topology="8"), "acceleratorTopology': '8'"),
        (workload("wp-c", topology="2x2"), "acceleratorTopology': '2x2'"),
        (workload("wp-c", kind="HIGH_AVAILABILITY"), "Only a HIGH_THROUGHPUT policy takes one"),
        (workload("Bad_Name"), "resource.name': 'Bad_Name'"),
        (compute_v1.ResourcePolicy(name="wp-c"), "exactly one policy"),
    ],
)
def test_bad_policies_are_400(policies, body, message):
    with pytest.raises(exceptions.BadRequest, match=message):
        policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=body)


def test_gke_places_tpu7x_pools_only_by_a_high_throughput_policy_of_their_region(standin, policies, operations):
    gke = ClusterManagerClient(**_options(standin))

    def create(name: str, policy: str) -> Any:
        body = {
            "name": name,
            "config": {"machineType": "tpu7x-standard-4t"},
            "initialNodeCount": 2,
            "placementPolicy": {"policyName": policy},
        }
        return gke.create_node_pool(parent=PARENT, node_pool=NodePool.from_json(json.dumps(body)))

    insert_and_wait(policies, operations, workload("wp-far"), region="europe-west4")
    insert_and_wait(policies, operations, workload("wp-ha", kind="HIGH_AVAILABILITY", topology=None))
    for policy in ("wp-far", "wp-ha", "wp-none"):
        with pytest.raises(exceptions.BadRequest, match=f'"{policy}" was not found in this region'):
            create("np-1", policy)
    insert_and_wait(policies, operations, workload("wp-here"))
    create("np-1", "wp-here")
    [pool] = standin.node_pools()
    assert pool["nodeLabels"]["cloud.google.com/gke-tpu-topology"] == "2x2x2"

    # Compute refuses to delete a policy a pool still uses.
    with pytest.raises(exceptions.BadRequest, match="already being used by 'np-1'"):
        policies.delete_unary(project=PROJECT, region=REGION, resource_policy="wp-here")
    state = standin.state()
    assert {p["name"] for p in state["resourcePolicies"]} == {"wp-far", "wp-ha", "wp-here"}


@pytest.mark.long  # four gcloud runs (about 30 s on CI's two cores); the client tests above cover the API
def test_gcloud_makes_the_policy_and_a_pool_placed_by_it_as_xpk_does(standin, tmp_path):
    """The seeds' tpu7x pool the way the GKE Ironwood page writes it: the workload policy first (gcloud
    compute, through the stand-in's /compute/v1), then the pool with --placement-policy."""
    import os
    import shutil
    import subprocess

    if shutil.which("gcloud") is None:
        pytest.skip("gcloud is not installed on this machine")
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(tmp_path),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{standin.url}/compute/v1/",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER": f"{standin.url}/",
        "CLOUDSDK_AUTH_ACCESS_TOKEN": "standin",
        "CLOUDSDK_CORE_PROJECT": PROJECT,
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
    }

    def gcloud(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["gcloud", *args], env=env, capture_output=True, text=True, timeout=300)

    made = gcloud(
        "compute", "resource-policies", "create", "workload-policy", "wp-seed",
        "--type=HIGH_THROUGHPUT", "--accelerator-topology=2x2x2", f"--region={REGION}",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    pool = gcloud(
        "container", "node-pools", "create", "tpu-multi-host-pool", "--cluster=c1", f"--zone={REGION}-b",
        "--machine-type=tpu7x-standard-4t", "--placement-policy=wp-seed", "--num-nodes=2",
    )  # fmt: skip
    assert pool.returncode == 0, pool.stderr
    [created] = standin.node_pools()
    assert created["placementPolicy"] == {"policyName": "wp-seed"} and created["status"] == "RUNNING"
    refused = gcloud("compute", "resource-policies", "delete", "wp-seed", f"--region={REGION}", "--quiet")
    assert refused.returncode != 0 and "already being used by 'tpu-multi-host-pool'" in refused.stderr
