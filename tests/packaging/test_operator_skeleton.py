"""One operator skeleton, read from the source (the house rules, docs/contributing/development.md):

- an operator that waits runs ``execute`` -> ``execute_sync`` | ``execute_async`` -> ``execute_complete``:
  every class that defines ``execute_complete`` also has ``execute_sync`` and ``execute_async``, its own or
  inherited from a tpuflow base class;
- every such class is found, whichever subpackage it lives in.

Every provider module is read (the CLI holds no operator; the rehearsal lab is another distribution). The argument-check shape and
``on_kill``'s one attribute have their own tests (test_argument_shape.py, test_on_kill_attribute.py).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operators" / "tpuflow"
DEV_TOOLS = ("cli",)


def provider_modules() -> list[str]:
    """Every module of the provider (the dev tools and the CLI are not operators)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "__pycache__" not in parts and parts[1] not in DEV_TOOLS:
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


CONVERTED = provider_modules()
SKELETON = {"execute_sync", "execute_async"}
# Operators whose wait is Airflow's own, not tpuflow's: their execute_complete extends Airflow's completion.
AIRFLOW_WAITS = {
    # Airflow's HITL defers it to its HITLTrigger; there is no wait a worker could run instead
    ("tpuflow.cost.approval", "ChipBudgetApprovalOperator"),
}


def path_of(module: str) -> Path:
    relative = Path(*module.split(".")[1:])
    package = PACKAGE / relative / "__init__.py"
    return package if package.exists() else (PACKAGE / relative).with_suffix(".py")


@cache
def parsed(module: str) -> ast.Module:
    return ast.parse(path_of(module).read_text(), filename=str(path_of(module)))


def imported_names(module: str) -> dict[str, str]:
    """Names this module imports from tpuflow modules (at any depth), as {local name: "module.Name"}."""
    names = {}
    for node in ast.walk(parsed(module)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpuflow"):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def classes(module: str) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in parsed(module).body if isinstance(node, ast.ClassDef)}


def methods(module: str, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The methods class ``module.name`` defines or inherits from tpuflow classes (bases outside tpuflow,
    e.g. Airflow's BaseOperator, add none of the skeleton)."""
    node = classes(module).get(name)
    if node is None or f"{module}.{name}" in seen:
        return set()
    found = {item.name for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)}
    for base in node.bases:
        if not isinstance(base, ast.Name):
            continue
        if base.id in classes(module):
            found |= methods(module, base.id, seen | {f"{module}.{name}"})
        elif base.id in imported_names(module):
            base_module, _, base_name = imported_names(module)[base.id].rpartition(".")
            if path_of(base_module).exists():
                found |= methods(base_module, base_name, seen | {f"{module}.{name}"})
    return found


def test_the_converted_modules_exist() -> None:
    assert [m for m in CONVERTED if not path_of(m).exists()] == []


@pytest.mark.parametrize("module", CONVERTED)
def test_an_operator_that_completes_a_wait_has_the_sync_and_the_async_path(module: str) -> None:
    incomplete = {
        name: sorted(SKELETON - have)
        for name in classes(module)
        if "execute_complete" in (have := methods(module, name))
        and not SKELETON <= have
        and (module, name) not in AIRFLOW_WAITS
    }
    assert incomplete == {}, f"{module}: execute -> execute_sync | execute_async -> execute_complete"


def test_the_check_sees_inherited_skeletons_and_missing_ones() -> None:
    """The reading itself: a subclass inherits its tpuflow base's methods, across modules."""
    assert SKELETON | {"execute_complete"} <= methods("tpuflow.gke.operators", "GKEDeleteNodePoolOperator")
    assert SKELETON | {"execute_complete"} <= methods("tpuflow.rayjob.workload_operators", "RayTrainOperator")
    assert "validate_arguments" in methods("tpuflow.capacity.operators", "GKEDeleteProvisioningRequestOperator")
    assert not SKELETON <= methods("tpuflow.local.operators", "LocalRayDeleteClusterOperator")
