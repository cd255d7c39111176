"""Renamed operators keep their old name for one release (tpuflow.deprecations): the old name warns with
Airflow's AirflowProviderDeprecationWarning naming the new class and builds the new class; the new name does
not warn."""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

V6E_2X2 = {"accelerator": "v6e", "topology": "2x2"}
SLICES = [{"role": "train", "tpu": {"generation": "v6e", "chips": 4, "num_slices": 1}, "task_id": "create"}]
GKE = {"project_id": "my-project", "location": "us-east5-b", "cluster_name": "c"}

# (module, old name, new name, the arguments both need)
RENAMED: list[tuple[str, str, str, dict[str, Any]]] = [
    ("tpuflow.local.operators", "LocalRayClusterCreateOperator", "LocalRayCreateClusterOperator", {"tpu_slice": V6E_2X2}),
    ("tpuflow.local.operators", "LocalRayClusterDeleteOperator", "LocalRayDeleteClusterOperator", {}),
    ("tpuflow.slices.operators", "AcquireSliceOperator", "TPUAcquireSliceOperator", {}),
    ("tpuflow.slices.operators", "ReleaseSliceOperator", "TPUReleaseSliceOperator", {}),
    ("tpuflow.cost.operators", "ReapOrphansOperator", "TPUReapOrphansOperator", {}),
    ("tpuflow.cost.operators", "ChipBudgetGuardOperator", "TPUCheckChipBudgetOperator", {"slices": SLICES}),
    ("tpuflow.cost.operators", "ChipLedgerOperator", "TPUWriteChipLedgerOperator", {"slices": SLICES, "output_dir": "o"}),
    ("tpuflow.cost.operators", "GKEChipLedgerOperator", "GKEWriteChipLedgerOperator", {"slices": SLICES, "output_dir": "o", **GKE}),
    ("tpuflow.cost.local", "LocalChipLedgerOperator", "LocalWriteChipLedgerOperator", {"slices": SLICES, "output_dir": "o"}),
]  # fmt: skip


def concrete(cls: type[Any]) -> type[Any]:
    """The class itself, or for an abstract base (the ledger's, whose ``spans`` a backend writes) a
    subclass as a user's backend would write it."""
    if not inspect.isabstract(cls):
        return cls
    return type(f"My{cls.__name__}", (cls,), {"spans": lambda self, context: []})


@pytest.mark.parametrize(("module", "old", "new", "arguments"), RENAMED, ids=[old for _, old, _, _ in RENAMED])
def test_the_old_name_warns_and_builds_the_new_operator(
    module: str, old: str, new: str, arguments: dict[str, Any]
) -> None:
    loaded = importlib.import_module(module)
    with pytest.warns(AirflowProviderDeprecationWarning, match=rf"{old} is renamed {new}\b"):
        op = concrete(getattr(loaded, old))(task_id="t", **arguments)
    assert isinstance(op, getattr(loaded, new))
    assert op.task_id == "t"


@pytest.mark.parametrize(("module", "old", "new", "arguments"), RENAMED, ids=[new for _, _, new, _ in RENAMED])
def test_the_new_name_does_not_warn(module: str, old: str, new: str, arguments: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", AirflowProviderDeprecationWarning)
        op = concrete(getattr(importlib.import_module(module), new))(task_id="t", **arguments)
    assert new in {type(op).__name__, type(op).__mro__[1].__name__}


KUBE = {"kubernetes_conn_id": "kube"}
RAY_SLICE = {"tpu_slice": V6E_2X2, "image": "rayproject/ray:2.60.0-py311"}
TRAIN = {
    "cluster": {"dashboard_url": "http://127.0.0.1:8265"},
    "framework": "jax",
    "train_loop": "my_pkg.fit:train_loop",
    "tpu_slice": V6E_2X2,
    "storage_path": "/tmp/ckpt",
    "run_name": "r",
}
# (module, old class, the class it now is, the old arguments, the argument they became: name and value)
REPLACED: list[tuple[str, str, str, dict[str, Any], tuple[str, Any]]] = [
    ("tpuflow.pipeline.gke", "QueuedCapacityRayClusterOperator", "KubeRayCreateClusterOperator",
     {**RAY_SLICE, **KUBE, "provisioning_request": "pr-1"}, ("provisioning_request_name", "pr-1")),
    ("tpuflow.pipeline.gke", "QueuedCapacityDeployServiceOperator", "KubeRayDeployServiceOperator",
     {**RAY_SLICE, **KUBE, "serve_config": {"applications": [{"name": "app", "import_path": "m:app", "route_prefix": "/"}]}, "provisioning_request": "pr-1"},
     ("provisioning_request_name", "pr-1")),
    ("tpuflow.pipeline.gke", "KeepableDeleteServiceOperator", "KubeRayDeleteServiceOperator",
     {**KUBE, "service_task_id": "deploy", "keep": "{{ x }}"}, ("keep", "{{ x }}")),
    ("tpuflow.pipeline.gke", "KeepableDeleteProvisioningRequestOperator", "GKEDeleteProvisioningRequestOperator",
     {**KUBE, "created_by_task_id": "request", "keep": True}, ("keep", True)),
    ("tpuflow.pipeline.gke", "KeepableDeleteNodePoolOperator", "GKEDeleteNodePoolOperator",
     {**GKE, "created_by_task_id": "create", "keep": True}, ("keep", True)),
    ("tpuflow.cost.training", "BudgetedRayTrainOperator", "RayTrainOperator",
     {**TRAIN, "max_chip_hours": 3, "project_id": "p"}, ("budget", None)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "old", "new", "arguments", "argument"), REPLACED, ids=[old for _, old, *_ in REPLACED]
)
def test_a_replaced_subclass_warns_and_sets_the_argument_of_the_operator_it_extended(
    module: str, old: str, new: str, arguments: dict[str, Any], argument: tuple[str, Any]
) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match=rf"{old} is deprecated: use {new}\("):
        op = getattr(importlib.import_module(module), old)(task_id="t", **arguments)
    assert new in [c.__name__ for c in type(op).__mro__]
    name, value = argument
    assert name in op.template_fields
    if name == "budget":  # the old arguments became a ChipHourBudget
        from tpuflow.cost.training import ChipHourBudget

        assert isinstance(op.budget, ChipHourBudget)
        assert (op.budget.max_chip_hours, op.budget.project_id) == (3, "p")
    else:
        assert getattr(op, name) == value
