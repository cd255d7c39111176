"""`tpuflow render nodepool`: the request bodies match the GKE TPU docs, field by field, and are
exactly what the hook sends through the real client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE

from tpuflow.cli import main

BASE = ["render", "nodepool", "--project", PROJECT, "--location", ZONE, "--cluster", CLUSTER, "--json"]


def render(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main([*BASE, *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_v6e_4x4_spot(capsys):
    pool = render(capsys, "--accelerator", "v6e", "--topology", "4x4", "--capacity", "spot")["nodePool"]
    assert pool["config"]["machineType"] == "ct6e-standard-4t"
    assert pool["initialNodeCount"] == 4  # 16 chips / 4 per VM
    assert pool["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
    assert pool["config"]["spot"] is True
    assert pool["config"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert pool["locations"] == [ZONE]
    assert "flexStart" not in pool["config"] and "autoscaling" not in pool


def test_v5e_2x4_on_one_8_chip_vm(capsys):
    pool = render(capsys, "--accelerator", "TPU-V5LITEPOD", "--topology", "2x4")["nodePool"]
    assert pool["config"]["machineType"] == "ct5lp-hightpu-8t"
    assert pool["initialNodeCount"] == 1
    assert "placementPolicy" not in pool  # single-host: no topology, no COMPACT
    assert "spot" not in pool["config"]


def test_v5e_2x4_on_two_4_chip_vms(capsys):
    pool = render(
        capsys, "--accelerator", "tpu-v5-lite-podslice", "--topology", "2x4", "--machine-type", "ct5lp-hightpu-4t"
    )["nodePool"]
    assert pool["config"]["machineType"] == "ct5lp-hightpu-4t"
    assert pool["initialNodeCount"] == 2
    assert pool["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "2x4"}


def test_v5p_2x2x2_with_a_reservation(capsys):
    pool = render(capsys, "--accelerator", "v5p", "--topology", "2x2x2", "--capacity", "reservation:tpu-res-1")[
        "nodePool"
    ]
    assert pool["config"]["machineType"] == "ct5p-hightpu-4t"
    assert pool["initialNodeCount"] == 2
    assert pool["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "2x2x2"}
    assert pool["config"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["tpu-res-1"],
    }
    assert "spot" not in pool["config"]


def test_tpu7x_2x2x2_uses_a_workload_policy_not_a_topology(capsys):
    pool = render(capsys, "--accelerator", "tpu7x", "--topology", "2x2x2", "--workload-policy", "ht-2x2x2")["nodePool"]
    assert pool["config"]["machineType"] == "tpu7x-standard-4t"
    assert pool["initialNodeCount"] == 2
    assert pool["placementPolicy"] == {"policyName": "ht-2x2x2"}


def test_tpu7x_multi_host_without_a_workload_policy_says_how_to_make_one(capsys):
    # The operator makes the policy itself now (tests/cli/test_render_workload_policy.py): the render
    # shows it, with the gcloud command that makes the same one by hand.
    assert main([*BASE[:-1], "--accelerator", "tpu7x", "--topology", "2x2x2"]) == 0
    out = capsys.readouterr().out
    assert "workload-policy" in out and "--type=HIGH_THROUGHPUT --accelerator-topology=2x2x2" in out


def test_single_host_v6e_2x2(capsys):
    pool = render(capsys, "--accelerator", "TPU-V6E", "--topology", "2x2")["nodePool"]
    assert pool["config"]["machineType"] == "ct6e-standard-4t"
    assert pool["initialNodeCount"] == 1
    assert "placementPolicy" not in pool


def test_multi_host_slices_get_one_pool_each_single_host_slices_share_one(capsys):
    bodies = render(capsys, "--accelerator", "v6e", "--topology", "4x4", "--num-slices", "3")
    assert [b["nodePool"]["initialNodeCount"] for b in bodies] == [4, 4, 4]
    assert len({b["nodePool"]["name"] for b in bodies}) == 3
    single = render(capsys, "--accelerator", "v6e", "--topology", "2x2", "--num-slices", "3")["nodePool"]
    assert single["initialNodeCount"] == 3 and "placementPolicy" not in single


def test_flex_start_and_queued_start_empty_and_scale_to_the_slice(capsys):
    flex = render(capsys, "--accelerator", "v6e", "--topology", "4x4", "--capacity", "flex-start")["nodePool"]
    assert flex["config"]["flexStart"] is True
    assert flex["initialNodeCount"] == 0
    assert flex["autoscaling"] == {"enabled": True, "minNodeCount": 0, "maxNodeCount": 4}
    queued = render(capsys, "--accelerator", "v6e", "--topology", "4x4", "--capacity", "queued")["nodePool"]
    assert queued["queuedProvisioning"] == {"enabled": True}
    assert queued["management"] == {"autoRepair": False}
    assert queued["autoscaling"]["totalMaxNodeCount"] == 4


def test_task_identity_gives_the_operators_name_and_ownership_labels(capsys):
    ident = ["--dag-id", "train", "--run-id", "manual__2026-11-29T10:00:00+00:00", "--task-id", "create_pool"]
    pool = render(capsys, "--accelerator", "v6e", "--topology", "4x4", *ident)["nodePool"]
    again = render(capsys, "--accelerator", "v6e", "--topology", "4x4", *ident)["nodePool"]
    assert pool["name"] == again["name"] and pool["name"].startswith("create-pool-")
    labels = pool["config"]["resourceLabels"]
    assert labels["tpuflow-dag"] == "train" and labels["tpuflow-task"] == "create_pool"
    assert labels["tpuflow-run"] == "manual__2026-11-29t10_00_00_00_00"


CASES = {
    "v6e-4x4-spot": ["--accelerator", "v6e", "--topology", "4x4", "--capacity", "spot"],
    "v5e-2x4-one-vm": ["--accelerator", "v5e", "--topology", "2x4"],
    "v5e-2x4-two-vms": ["--accelerator", "v5e", "--topology", "2x4", "--machine-type", "ct5lp-hightpu-4t"],
    "v5p-2x2x2-reservation": ["--accelerator", "v5p", "--topology", "2x2x2", "--capacity", "reservation:tpu-res-1"],
    "tpu7x-2x2x2": ["--accelerator", "tpu7x", "--topology", "2x2x2", "--workload-policy", "ht-2x2x2"],
    "v6e-2x2": [
        "--accelerator",
        "v6e",
        "--topology",
        "2x2",
        "--node-label",
        "team=ml",
        "--node-taint",
        "dedicated=tpu:NoSchedule",
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_body_is_what_the_client_sends(case, capsys, gke):
    """The hook turns the body into the client's NodePool; GKE (the stand-in) receives the same message."""
    from google.cloud.container_v1.types import NodePool

    from tpuflow.gke.hooks import GKENodePoolHook, to_rest_json

    gke.add_workload_policy("ht-2x2x2", "2x2x2")
    rendered = render(capsys, *CASES[case])
    hook = GKENodePoolHook(gcp_conn_id=CONN_ID, location=ZONE)
    hook.create_node_pool(project_id=PROJECT, cluster_name=CLUSTER, node_pool=rendered["nodePool"])
    [sent] = [r["body"] for r in gke.requests if r["method"] == "POST"]
    assert set(sent) == {"nodePool"}
    # On the wire the client writes enums as numbers; read back as a message, it is the rendered one.
    assert to_rest_json(NodePool.from_json(json.dumps(sent["nodePool"]))) == rendered["nodePool"]
    # ... and GKE's rules (as the stand-in checks them) accept it.
    assert [p["status"] for p in gke.node_pools()] == ["PROVISIONING"]
