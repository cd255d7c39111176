"""One set of Kubernetes label rules (tpuflow.labels) behind every path that takes labels: GKE node
labels and taints, KubeRay manifest labels and pod labels. A key or value accepted by one is accepted by
all, and one rejected by one is rejected by all."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.gke.nodepool_spec import check_node_labels, check_node_taints
from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest, rayservice_manifest
from tpuflow.kubernetes import values as k8s_values
from tpuflow.labels import (
    check_gce_labels,
    check_labels,
    gce_label_value,
    gce_ownership_labels,
    kubernetes_ownership_labels,
    label_safe,
)
from tpuflow.naming import TaskIdentity
from tpuflow.tpu import TpuSlice

TPU = TpuSlice.from_spec("v5e", "2x2")
SERVE = {"applications": [{"name": "app", "import_path": "m:app", "route_prefix": "/"}]}

GOOD_KEYS = ["team", "example.com/team", "a.b-c_d", "A9", "x" * 63, ("p" * 60 + ".io/") + "n", "a/" + "b" * 63]
BAD_KEYS = [
    "",
    "/team",
    "-team",
    "team-",
    "x" * 64,
    "Example.com/team",
    "a..b/c",
    "a/b/c",
    "ex ample/t",
    "a/",
    ("p" * 254) + "/n",
    "a-.b/c",
]
GOOD_VALUES = ["", "ml", "ML.v2_x-1", "9", "z" * 63]
BAD_VALUES = ["-ml", "ml-", "m l", "z" * 64, "ä", "a/b"]


def _paths(labels: dict[str, Any]) -> dict[str, Any]:
    """Every way a user's labels reach an API, each returning what it would send (or raising)."""
    taints = [{"key": k, "value": v, "effect": "NoSchedule"} for k, v in labels.items()]
    return {
        "labels.check_labels": lambda: check_labels("labels", labels),
        "k8s_values.check_labels": lambda: k8s_values.check_labels("labels", labels),
        "node_labels": lambda: check_node_labels(labels),
        "node_taints": lambda: check_node_taints(taints),
        "raycluster labels": lambda: raycluster_manifest(
            RayClusterTemplate(TPU, image="rayproject/ray:2.60.0-py311"), name="rc", labels=labels
        ),
        "rayservice pod_labels": lambda: rayservice_manifest(
            RayClusterTemplate(TPU, image="rayproject/ray:2.60.0-py311"), SERVE, name="svc", pod_labels=labels
        ),
    }


def _accepted(labels: dict[str, Any]) -> dict[str, bool]:
    verdicts = {}
    for name, call in _paths(labels).items():
        try:
            call()
        except UserInputError:
            verdicts[name] = False
        else:
            verdicts[name] = True
    return verdicts


@pytest.mark.parametrize("key", GOOD_KEYS + BAD_KEYS)
def test_every_path_agrees_on_a_label_key(key: str) -> None:
    verdicts = _accepted({key: "v"})
    assert set(verdicts.values()) == {key in GOOD_KEYS}, verdicts


@pytest.mark.parametrize("value", GOOD_VALUES + BAD_VALUES)
def test_every_path_agrees_on_a_label_value(value: str) -> None:
    verdicts = _accepted({"example.com/team": value})
    assert set(verdicts.values()) == {value in GOOD_VALUES}, verdicts


def test_values_are_normalised_alike_and_errors_name_the_field_and_value() -> None:
    assert check_node_labels({"n": 3, "e": None}) == check_labels("x", {"n": 3, "e": None}) == {"n": "3", "e": ""}
    assert check_node_taints(["gen=5:NoSchedule"])[0]["value"] == check_labels("x", {"gen": 5})["gen"]
    with pytest.raises(UserInputError) as err:
        check_labels("pod_labels", {"team": "bad value"})
    assert (err.value.field, err.value.value) == ("pod_labels", "bad value") and "'team'" in str(err.value)
    with pytest.raises(UserInputError, match="give it as a string"):
        check_labels("labels", {"flag": True})


def test_names_derived_from_free_text_pass_the_rules_they_target() -> None:
    nasty = "Team.DAG:v2/ÄÖ " + "x" * 80 + "-"
    assert check_labels("labels", {"example.com/dag": label_safe(nasty)})
    assert check_gce_labels("resource_labels", {"tpuflow-dag": gce_label_value(nasty)})
    identity = TaskIdentity(nasty, "scheduled__2026-11-29T10:00:00+00:00", nasty, map_index=2)
    assert check_labels("labels", kubernetes_ownership_labels(identity))
    assert check_gce_labels("resource_labels", gce_ownership_labels(identity, 1_900_000_000))


def test_both_ownership_forms_carry_the_same_exact_identity() -> None:
    identity = TaskIdentity("dag", "run", "task", map_index=4)
    other_instance = TaskIdentity("dag", "run", "task", map_index=5)
    k8s, gce = kubernetes_ownership_labels(identity), gce_ownership_labels(identity, 1)
    assert k8s["tpuflow.dev/run-key"] == gce["tpuflow-key"] == identity.key
    assert kubernetes_ownership_labels(other_instance)["tpuflow.dev/run-key"] != identity.key


@pytest.mark.parametrize(
    ("labels", "fix"),
    [
        ({"Tpuflow-x": "a"}, "starting with a letter"),
        ({"9x": "a"}, "starting with a letter"),
        ({"x": "A"}, "a-z 0-9 _ -"),
        ({"x": "a" * 64}, "at most 63"),
    ],
)
def test_gce_label_rules(labels: dict[str, str], fix: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(fix)):
        check_gce_labels("resource_labels", labels)
