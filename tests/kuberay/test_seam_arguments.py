"""What were pipeline-only subclasses are arguments of the KubeRay operators: ``provisioning_request_name`` on
the create and deploy operators (their TPU pods consume that ProvisioningRequest), ``keep`` on the deletes."""

from __future__ import annotations

import pytest

from tpuflow.errors import UserInputError
from tpuflow.kuberay.operators import (
    KubeRayCreateClusterOperator,
    KubeRayDeleteClusterOperator,
    KubeRayDeleteServiceOperator,
    KubeRayDeployServiceOperator,
)

SLICE = {"tpu_slice": {"accelerator": "v6e", "topology": "2x2"}, "image": "rayproject/ray:2.60.0-py311"}


def test_the_tpu_pods_consume_the_named_provisioning_request() -> None:
    op = KubeRayCreateClusterOperator(task_id="c", provisioning_request_name="pr-1", **SLICE)
    annotations = op.build_template().worker_group({})["template"]["metadata"]["annotations"]
    assert "pr-1" in annotations.values()
    plain = KubeRayCreateClusterOperator(task_id="c", **SLICE).build_template()
    assert plain.provisioning_request is None
    for cls in (KubeRayCreateClusterOperator, KubeRayDeployServiceOperator):
        assert "provisioning_request_name" in cls.template_fields


def test_a_bad_provisioning_request_name_or_one_beside_a_manifest_is_one_line() -> None:
    with pytest.raises(UserInputError, match=r"^provisioning_request\b.*is invalid") as err:
        KubeRayCreateClusterOperator(task_id="c", provisioning_request_name="Not_A_Name", **SLICE)
    assert "\n" not in str(err.value)
    manifest = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {"headGroupSpec": {}}}
    with pytest.raises(UserInputError, match=r"^provisioning_request_name='pr-1' is invalid: applies to the slice"):
        KubeRayCreateClusterOperator(task_id="c", manifest=manifest, provisioning_request_name="pr-1")


@pytest.mark.parametrize("cls", [KubeRayDeleteClusterOperator, KubeRayDeleteServiceOperator])
def test_the_deletes_take_keep_templated_default_false(cls: type) -> None:
    op = cls(task_id="d", name="x")
    assert op.keep is False and "keep" in op.template_fields
