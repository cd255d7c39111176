"""`tpuflow render nodepool` for multi-host tpu7x without --workload-policy: both request bodies, the
resource policy the operator makes and the pool placed by it, and they are what the hooks send."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE, connected_standin

from tpuflow.cli import main
from tpuflow.gke.workload_policy import workload_policy_name
from tpuflow.naming import TaskIdentity

BASE = ["render", "nodepool", "--project", PROJECT, "--location", ZONE, "--cluster", CLUSTER]
TPU7X = ["--accelerator", "tpu7x", "--topology", "2x2x2"]
IDENTITY = ["--dag-id", "train_dag", "--run-id", "manual__1", "--task-id", "create_pool"]


def render_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main([*BASE, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_text_form_shows_both_requests_policy_first(capsys):
    assert main([*BASE, *TPU7X]) == 0
    lines = capsys.readouterr().out.splitlines()
    policy_url = f"POST https://compute.googleapis.com/compute/v1/projects/{PROJECT}/regions/us-east5/resourcePolicies"
    assert lines[0].startswith(policy_url + ": ")
    body = json.loads(lines[0].split(": ", 1)[1])
    assert body["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    assert "gcloud compute resource-policies create workload-policy " + body["name"] in lines[1]
    [pool_line] = [line for line in lines if "container.googleapis.com" in line]
    assert "2 x tpu7x-standard-4t" in pool_line and f"'policyName': '{body['name']}'" in pool_line


def test_json_names_the_operators_policy_and_its_owner(capsys):
    out = render_json(capsys, *TPU7X, *IDENTITY)
    identity = TaskIdentity("train_dag", "manual__1", "create_pool")
    name = workload_policy_name(identity, "tpu7x", "2x2x2")
    assert out["resourcePolicy"]["name"] == name
    assert f"tpuflow-key={identity.key}" in out["resourcePolicy"]["description"]
    assert out["nodePool"]["placementPolicy"] == {"policyName": name}
    assert out["nodePool"]["config"]["resourceLabels"]["tpuflow-key"] == identity.key


def test_several_slices_share_one_policy(capsys):
    out = render_json(capsys, *TPU7X, "--num-slices", "2")
    names = {p["nodePool"]["placementPolicy"]["policyName"] for p in out["nodePools"]}
    assert names == {out["resourcePolicy"]["name"]} and len(out["nodePools"]) == 2


def test_a_given_policy_renders_the_pool_alone(capsys):
    out = render_json(capsys, *TPU7X, "--workload-policy", "team-ht")
    assert set(out) == {"nodePool"} and out["nodePool"]["placementPolicy"] == {"policyName": "team-ht"}


def test_the_rendered_bodies_are_what_the_hooks_send_and_the_stand_ins_accept(capsys, monkeypatch):
    from google.cloud.compute_v1 import ResourcePolicy

    from tpuflow.gke.hooks import ComputeResourcePolicyHook, GKENodePoolHook, to_rest_json

    out = render_json(capsys, *TPU7X, *IDENTITY)
    with connected_standin(monkeypatch, operation_seconds=0.05) as gke:
        compute = ComputeResourcePolicyHook(gcp_conn_id=CONN_ID)
        operation = compute.insert_resource_policy(
            project_id=PROJECT, region="us-east5", resource_policy=out["resourcePolicy"]
        )
        compute.get_region_operations_client().wait(project=PROJECT, region="us-east5", operation=operation.name)
        [sent] = [r["body"] for r in gke.requests if r["path"].endswith("/resourcePolicies")]
        assert to_rest_json(ResourcePolicy.from_json(json.dumps(sent))) == out["resourcePolicy"]
        GKENodePoolHook(gcp_conn_id=CONN_ID, location=ZONE).create_node_pool(
            project_id=PROJECT, cluster_name=CLUSTER, node_pool=out["nodePool"]
        )
        assert [p["status"] for p in gke.node_pools()] == ["PROVISIONING"]
