"""Which modules a Python source imports, read from its syntax tree (nothing is imported)."""

from __future__ import annotations

import ast


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in `source`, at any depth (inside functions too),
    relative imports resolved against `package`, `from X import name` counted as X.name as well as X,
    and importlib.import_module("...") / __import__("...") calls with a literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found
