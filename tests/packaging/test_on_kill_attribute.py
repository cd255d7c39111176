"""What ``on_kill`` cleans up is one declared attribute, ``self._owned`` (as the KubeRay operators'), read from
the source of every provider operator: ``__init__`` (the class's own or a tpuflow base's) sets it to None, the
task assigns it while it waits on what it created, and ``on_kill`` reads it."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operators" / "tpuflow"
SUBPACKAGES = tuple(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "cli"))
OWNED = "_owned"


def killable_classes() -> list[tuple[str, ast.ClassDef]]:
    """(file, class) of every provider class whose own on_kill cleans something up."""
    found = []
    for sub in SUBPACKAGES:
        for path in sorted((PACKAGE / sub).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(f, ast.FunctionDef) and f.name == "on_kill" for f in node.body
                ):
                    found.append((str(path.relative_to(PACKAGE.parent)), node))
    return found


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name), None)


def self_attributes(node: ast.AST, *, stored: bool) -> list[ast.Attribute]:
    kind = ast.Store if stored else ast.Load
    return [
        a
        for a in ast.walk(node)
        if isinstance(a, ast.Attribute)
        and isinstance(a.value, ast.Name)
        and a.value.id == "self"
        and isinstance(a.ctx, kind)
    ]


KILLABLE = killable_classes()


def test_the_killable_operators_are_found() -> None:
    assert {"RaySubmitJobOperator", "RayServeDeployOperator"} <= {cls.name for _, cls in KILLABLE}


@pytest.mark.parametrize(("path", "cls"), KILLABLE, ids=[cls.name for _, cls in KILLABLE])
def test_on_kill_cleans_up_what_self_owned_names(path: str, cls: ast.ClassDef) -> None:
    on_kill = method(cls, "on_kill")
    assert on_kill is not None
    module = ".".join(Path(path).with_suffix("").parts)
    mro = [b for b in getattr(importlib.import_module(module), cls.name).__mro__ if b.__module__.startswith("tpuflow.")]
    inits = [ast.parse(textwrap.dedent(inspect.getsource(b.__init__))) for b in mro if "__init__" in vars(b)]
    declared = [
        s
        for init in inits
        for s in ast.walk(init)
        if isinstance(s, ast.AnnAssign | ast.Assign)
        and any(t.attr == OWNED for t in self_attributes(s, stored=True))
        and isinstance(s.value, ast.Constant)
        and s.value.value is None
    ]
    assert declared, f"{path} {cls.name}: no __init__ of it or its tpuflow bases declares self.{OWNED} = None"
    assert {a.attr for a in self_attributes(on_kill, stored=False) if a.attr.startswith("_")} == {OWNED}, (
        f"{path} {cls.name}.on_kill cleans up something other than self.{OWNED}"
    )
    bodies = [ast.parse(textwrap.dedent(inspect.getsource(b))) for b in mro]
    assigned = [
        a
        for body in bodies
        for f in ast.walk(body)
        if isinstance(f, ast.FunctionDef) and f.name not in ("__init__", "on_kill")
        for a in self_attributes(f, stored=True)
        if a.attr == OWNED
    ]
    assert assigned, f"{path} {cls.name} never records what it owns in self.{OWNED}"
