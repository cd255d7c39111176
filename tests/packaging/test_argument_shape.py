"""One argument-check shape in every provider operator (tpuflow.arguments), read from the source: no module keeps an older shape (``_check_arguments``, ``_checked_fields``,
``_check_static_arguments``, a check taking ``rendered=``, its own ``validate_arguments``), and every operator
class that checks its arguments does it through ``ArgumentChecks``."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuflow.arguments import ArgumentChecks

PACKAGE = Path(__file__).resolve().parents[2] / "operators" / "tpuflow"
# every subpackage of the provider (the CLI holds no operator)
SUBPACKAGES = tuple(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "cli"))
OLD_SHAPES = {"_check_arguments", "_checked_fields", "_check_static_arguments", "_check_static_names"}
# The helper's two moments: operators list their checks (argument_checks) and never redefine these.
HELPER_MOMENTS = {"validate_arguments", "check_static_arguments"}
CHECK_CALL = re.compile(r"check|validat", re.IGNORECASE)


def module_files() -> list[Path]:
    return sorted(p for sub in SUBPACKAGES for p in (PACKAGE / sub).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def defined_names(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(name, line) of every function, class attribute, variable and ``self.<attribute>`` the module defines."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node.lineno
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    yield target.id, node.lineno
                elif isinstance(target, ast.Attribute):
                    yield target.attr, node.lineno


def rendered_checks(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Check functions of the old two-moment shape: ``def _check_x(..., rendered)``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and "check" in node.name:
            arguments = [*node.args.args, *node.args.kwonlyargs]
            if any(a.arg == "rendered" for a in arguments):
                yield node.name, node.lineno


def checks_arguments(cls: ast.ClassDef) -> bool:
    """The class lists checks, or its ``__init__`` checks a value (a check or validate call, a raise)."""
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    if "argument_checks" in methods:
        return True
    init = methods.get("__init__")
    for node in ast.walk(init) if init else ():
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if CHECK_CALL.search(name):
                return True
    return False


def checking_classes() -> list[tuple[str, str]]:
    """(module, class) of every top-level class of the four subpackages that checks its arguments."""
    found = []
    for path in module_files():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Operator") and checks_arguments(node):
                found.append((module_name(path), node.name))
    return found


def test_no_module_keeps_an_older_argument_check_shape() -> None:
    found = []
    for path in module_files():
        tree = ast.parse(path.read_text())
        where = path.relative_to(PACKAGE.parent)
        found += [f"{where}:{line} {name}" for name, line in defined_names(tree) if name in OLD_SHAPES | HELPER_MOMENTS]
        found += [f"{where}:{line} {name}(rendered=...)" for name, line in rendered_checks(tree)]
    assert not found, "checks go in argument_checks() (tpuflow.arguments), not:\n" + "\n".join(found)


CHECKING = checking_classes()


def test_the_argument_checking_classes_are_found() -> None:
    names = {name for _, name in CHECKING}
    assert {
        "RaySubmitJobOperator",
        "RayTrainOperator",
        "RaySlicePreflightOperator",
        "RayServeDeployOperator",
        "ServeEndpointSmokeTestOperator",
        "TPUCheckChipBudgetOperator",
        "TPUReapOrphansOperator",
        "BuildServeConfigOperator",
        "WriteReportOperator",
    } <= names


@pytest.mark.parametrize(("module", "name"), CHECKING, ids=[f"{m}.{n}" for m, n in CHECKING])
def test_every_operator_that_checks_arguments_uses_argument_checks(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, ArgumentChecks), f"{module}.{name} checks its arguments outside tpuflow.arguments"
