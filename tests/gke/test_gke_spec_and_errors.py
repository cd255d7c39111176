"""Pure parts: capacity parsing, names, ownership labels, spec comparison and error classification."""

from __future__ import annotations

import re

import pytest
from support.node_pool_plans import node_pool_plan

from tpuflow.errors import UserInputError
from tpuflow.gke.errors import FailureKind, classify, classify_operation
from tpuflow.gke.nodepool_spec import (
    Capacity,
    match_capacity,
    parse_capacity,
    parse_capacity_order,
)
from tpuflow.labels import gce_ownership_labels as ownership_labels
from tpuflow.naming import TaskIdentity

GKE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
GCE_LABEL = re.compile(r"^[a-z0-9_-]{0,63}$")


plan = node_pool_plan


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("on-demand", Capacity("on-demand")),
        (" SPOT ", Capacity("spot")),
        ("reservation:tpu-res-1", Capacity("reservation", "tpu-res-1")),
        (
            "reservation:projects/owner-proj/reservations/shared-1",
            Capacity("reservation", "projects/owner-proj/reservations/shared-1"),
        ),
        ("flex-start", Capacity("flex-start")),
        ("queued", Capacity("queued")),
    ],
)
def test_capacity_forms(text, expected):
    assert parse_capacity(text) == expected


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("reservation", "needs its name"),
        ("reservation:Bad_Name", "lowercase letters"),
        ("spot:now", "only reservation takes"),
        ("preemptible", "use spot"),
        ("", "use one of"),
    ],
)
def test_bad_capacity_names_the_field_and_the_fix(text, fix):
    with pytest.raises(UserInputError) as err:
        parse_capacity(text)
    assert err.value.field == "capacity" and fix in err.value.fix


def test_fallback_order_accepts_a_list_or_a_comma_string():
    assert parse_capacity_order("spot", "on-demand, flex-start") == (
        Capacity("spot"),
        Capacity("on-demand"),
        Capacity("flex-start"),
    )
    assert parse_capacity_order("spot", ["reservation:r1"]) == (Capacity("spot"), Capacity("reservation", "r1"))


def test_names_are_deterministic_valid_and_unique_per_task_instance():
    long_task = "a_very_long_task_id_for_provisioning_the_training_slice_" * 3
    names = {
        identity: plan(identity=identity).names
        for identity in (
            TaskIdentity("dag", "run-1", "create"),
            TaskIdentity("dag", "run-2", "create"),
            TaskIdentity("dag", "run-1", "create", map_index=3),
            TaskIdentity("dag", "run-1", long_task),
            TaskIdentity("dag", "run-1", "9_starts_with_digit"),
        )
    }
    assert plan(identity=TaskIdentity("dag", "run-1", "create")).names == names[TaskIdentity("dag", "run-1", "create")]
    assert len({n for ns in names.values() for n in ns}) == len(names)
    assert all(GKE_NAME.match(n) for ns in names.values() for n in ns)
    multi = plan(num_slices=4, identity=TaskIdentity("dag", "run-1", long_task)).names
    assert len(set(multi)) == 4 and all(GKE_NAME.match(n) for n in multi)


def test_an_explicit_name_too_long_for_the_slice_suffixes_is_rejected():
    with pytest.raises(UserInputError, match="shorten the name"):
        plan(node_pool_name="a" * 39, num_slices=2)


def test_ownership_labels_obey_gce_label_rules():
    nasty = TaskIdentity("Team.DAG:v2", "scheduled__2026-11-29T10:00:00.123456+00:00/ÄÖ" + "x" * 80, "Create Pool!")
    labels = ownership_labels(nasty, 1_900_000_000)
    assert all(re.match(r"^[a-z][a-z0-9_-]{0,62}$", k) for k in labels)
    assert all(GCE_LABEL.match(v) for v in labels.values())
    assert labels["tpuflow-key"] == nasty.key and labels["tpuflow-expires"] == "1900000000"
    other_run = ownership_labels(TaskIdentity(nasty.dag_id, nasty.run_id + "y", nasty.task_id), 1_900_000_000)
    assert other_run["tpuflow-run"] == labels["tpuflow-run"]  # truncated alike ...
    assert other_run["tpuflow-key"] != labels["tpuflow-key"]  # ... but the digest tells them apart


def test_an_existing_pool_matches_whichever_capacity_choice_made_it():
    p = plan(capacity="spot", fallback_capacity=["on-demand"])
    on_demand = p.body(0, Capacity("on-demand"))
    # GKE echoes the pool with extra fields of its own; those do not count.
    echoed = {
        **on_demand,
        "status": "RUNNING",
        "version": "1.34",
        "config": {
            **on_demand["config"],
            "labels": {"extra": "x"},
            "diskSizeGb": 100,
            "taints": [{"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}],
        },
    }
    assert match_capacity(p, 0, echoed) == (Capacity("on-demand"), [])
    reserved = plan(capacity="reservation:r1").body(0)
    capacity, diffs = match_capacity(p, 0, reserved)
    assert capacity is None
    assert (
        "config.reservationAffinity.consumeReservationType: want 'NO_RESERVATION', found 'SPECIFIC_RESERVATION'"
        in diffs
    )


# Messages as GKE and Compute Engine write them (from real operation errors and HTTP errors).
STOCKOUT_OP = {
    "status": "DONE",
    "error": {
        "code": 8,
        "message": "Instance 'gke-c-np-1' creation failed: The zone 'projects/p/zones/us-east5-b' does "
        "not have enough resources available to fulfill the request.  '(resource type:compute)'.",
    },
    "nodepoolConditions": [{"code": "GCE_STOCKOUT", "canonicalCode": "RESOURCE_EXHAUSTED", "message": "..."}],
}
QUOTA_OP = {
    "status": "DONE",
    "error": {
        "code": 8,
        "message": "Instance 'gke-e2e-pool' creation failed: Quota 'IN_USE_ADDRESSES' exceeded.  "
        "Limit: 8.0 in region europe-central2.",
    },
    "detail": "Insufficient quota to satisfy the request: Not all instances running in IGM after 26.6s.",
    "nodepoolConditions": [{"code": "GCE_QUOTA_EXCEEDED", "canonicalCode": "RESOURCE_EXHAUSTED"}],
}


def test_operation_errors_are_classified():
    assert classify_operation({"status": "DONE"}) is None
    assert classify_operation(STOCKOUT_OP).kind is FailureKind.STOCKOUT
    quota = classify_operation(QUOTA_OP)
    assert quota.kind is FailureKind.QUOTA and quota.quota == "IN_USE_ADDRESSES"


@pytest.mark.parametrize(
    ("http_code", "status", "message", "kind"),
    [
        (
            429,
            "RESOURCE_EXHAUSTED",
            'Too many operations: cluster "c" hits the concurrent operations quota 5, please try again later.',
            FailureKind.TOO_MANY_OPERATIONS,
        ),
        (
            400,
            "FAILED_PRECONDITION",
            "Operation operation-1596 is currently upgrading cluster c. Please wait and try again once it is done.",
            FailureKind.TOO_MANY_OPERATIONS,
        ),
        (
            403,
            "PERMISSION_DENIED",
            'Required "container.clusters.update" permission(s) for "projects/p".',
            FailureKind.PERMISSION,
        ),
        (
            403,
            "PERMISSION_DENIED",
            "Insufficient regional quota to satisfy request: resource \"CPUS\": request requires '96.0'",
            FailureKind.QUOTA,
        ),
        (
            503,
            "UNAVAILABLE",
            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: A ct6e-standard-4t VM is currently unavailable",
            FailureKind.STOCKOUT,
        ),
        (
            409,
            "ALREADY_EXISTS",
            "Already exists: projects/p/locations/z/clusters/c/nodePools/np.",
            FailureKind.ALREADY_EXISTS,
        ),
        (400, "INVALID_ARGUMENT", "Invalid TPU topology", FailureKind.INVALID_ARGUMENT),
        (503, "UNAVAILABLE", "The service is currently unavailable.", FailureKind.TRANSIENT),
    ],
)
def test_request_errors_are_classified(http_code, status, message, kind):
    failure = classify(http_code=http_code, status=status, message=message)
    assert failure.kind is kind
    if kind is FailureKind.QUOTA:
        assert failure.quota == "CPUS"
