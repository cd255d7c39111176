"""A step's import path ("pkg.module" or "pkg.module:function") resolved without importing anything.

The module's file is found the way ``import`` finds it (``importlib.machinery.PathFinder`` under given folders, or
the interpreter's own finders), and "module:function" is checked against the names the file binds at its top
level, read from its AST. So a DAG file can check a team's steps while it is parsed: none of the team's code,
nor the ML libraries it imports, is loaded.

Cheap to import (a DAG file's Workload uses it): the standard library only.
"""

from __future__ import annotations

import ast
import difflib
import pkgutil
import sys
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

_SHOWN = 8  # names listed in a message, at most


class NotFound(Exception):
    """The path's top-level package is not where it was looked for: nothing can be said about the rest."""


class Unresolved(Exception):
    """The path names a module or function that is not there.

    :param what: what is wrong, in words.
    :param fix: what to do about it.
    :param fixed: the path with its misspelt part replaced by the closest existing name; None: no close one.
    :param missing: the module or function is not there at all (not merely unusable).
    """

    def __init__(self, what: str, fix: str, fixed: str | None = None, *, missing: bool = False) -> None:
        super().__init__(f"{what}; {fix}")
        self.what = what
        self.fix = fix
        self.fixed = fixed
        self.missing = missing


def check_import_path(path: str, roots: Sequence[str] | None, *, runnable: bool = False) -> None:
    """Raise Unresolved when ``path`` names a module, or a top-level function of one, that does not exist;
    NotFound when its top-level package is not under ``roots`` (None: where ``import`` looks, sys.path
    and the interpreter's finders). ``runnable``: the module is run with ``python -m`` (a package needs a
    ``__main__``)."""
    module, _, function = path.partition(":")
    spec = find_module(module, roots, suffix=f":{function}" if function else "")
    if runnable and spec.submodule_search_locations is not None:
        if _child(f"{module}.__main__", list(spec.submodule_search_locations), roots) is None:
            raise Unresolved(
                f"{module} is a package without __main__.py, so python -m cannot run it",
                "add its __main__.py, or give a module",
            )
    if function:
        _check_defines(spec, module, function, roots)


def find_module(module: str, roots: Sequence[str] | None, *, suffix: str = "") -> ModuleSpec:
    """The spec of ``module`` (see check_import_path); ``suffix`` is appended to a suggested fix."""
    parts = module.split(".")
    spec = _top(parts[0], roots)
    if spec is None:
        raise NotFound(parts[0])
    for depth in range(1, len(parts)):
        parent, name = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
        if spec.submodule_search_locations is None:
            raise Unresolved(f"{parent} is a module, not a package: it holds no {parts[depth]}", "give a module path")
        locations = list(spec.submodule_search_locations)
        found = _child(name, locations, roots)
        if found is None:
            siblings = sorted(m.name for m in pkgutil.iter_modules(locations) if not m.name.startswith("_"))
            close = difflib.get_close_matches(parts[depth], siblings, n=1)
            fixed = ".".join([*parts[:depth], close[0], *parts[depth + 1 :]]) + suffix if close else None
            where = ", ".join(loc for loc in locations if not loc.endswith("__path_hook__"))
            what = f"no module {name} in {where}{_listing(parent, 'has', siblings)}"
            raise Unresolved(what, "give an existing module", fixed, missing=True)
        spec = found
    return spec


def top_level_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (defs, classes, assignments, imports, also under if / try /
    with / for); None when that cannot be told from the source (``from x import *``, a module ``__getattr__``)."""
    names: set[str] = set()
    for node in _top_level_statements(tree.body):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            return None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "__getattr__":
            return None
        names.update(_bound(node))
    return names


def _check_defines(spec: ModuleSpec, module: str, function: str, roots: Sequence[str] | None) -> None:
    origin = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    if origin is None or not origin.is_file():
        return  # a compiled or namespace module: its names cannot be read from source
    shown = _display(origin, roots)
    try:
        tree = ast.parse(origin.read_bytes(), filename=str(origin))
    except SyntaxError as err:
        raise Unresolved(f"{shown} does not parse (line {err.lineno}: {err.msg})", "fix its syntax") from None
    except ValueError as err:  # null bytes
        raise Unresolved(f"{shown} does not parse ({err})", "give it Python source") from None
    names = top_level_names(tree)
    if names is None or function in names:
        return
    statements = _top_level_statements(tree.body)
    defs = {n.name for n in statements if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    defined = sorted(name for name in defs if not name.startswith("_"))
    close = difflib.get_close_matches(function, sorted(names), n=1)
    raise Unresolved(
        f"{shown} defines no top-level {function}{_listing('it', 'defines', defined)}",
        "give a function the module defines at its top level",
        f"{module}:{close[0]}" if close else None,
        missing=True,
    )


def _top(name: str, roots: Sequence[str] | None) -> ModuleSpec | None:
    if roots is not None:
        return PathFinder.find_spec(name, list(roots))
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__spec__", None) is not None:
        return loaded.__spec__
    return _from_finders(name, None)


def _child(name: str, locations: list[str], roots: Sequence[str] | None) -> ModuleSpec | None:
    if roots is not None:
        return PathFinder.find_spec(name, locations)
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__spec__", None) is not None:
        return loaded.__spec__
    return _from_finders(name, locations)


def _from_finders(name: str, locations: list[str] | None) -> ModuleSpec | None:
    """What ``import`` would find (the interpreter's finders: sys.path, editable installs, ...), unimported."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec: ModuleSpec | None = find(name, locations, None)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def _top_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported: the body and its blocks, not functions' or classes'."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
            yield from _top_level_statements([*node.body, *getattr(node, "orelse", [])])
        elif isinstance(node, ast.Try | ast.TryStar):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            yield from _top_level_statements([*node.body, *handlers, *node.orelse, *node.finalbody])
        elif isinstance(node, ast.Match):
            yield from _top_level_statements([stmt for case in node.cases for stmt in case.body])


def _bound(node: ast.stmt) -> Iterator[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name
    elif isinstance(node, ast.Import | ast.ImportFrom):
        for alias in node.names:
            yield alias.asname or alias.name.split(".")[0]
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _target_names(target)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        yield from _target_names(node.target)
    elif isinstance(node, ast.With | ast.AsyncWith):
        for item in node.items:
            if item.optional_vars is not None:
                yield from _target_names(item.optional_vars)


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _listing(subject: str, verb: str, names: list[str]) -> str:
    if not names:
        return ""
    more = ", ..." if len(names) > _SHOWN else ""
    return f" ({subject} {verb} {', '.join(names[:_SHOWN])}{more})"


def _display(path: Path, roots: Sequence[str] | None) -> str:
    """``path`` relative to the root it is under (acme/fit.py), else as it is."""
    for root in roots or ():
        if path.is_relative_to(root):
            return str(path.relative_to(root))
    return str(path)
