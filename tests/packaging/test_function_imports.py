"""An import inside a function is there for one reason: what it loads is heavy, and the dag processor (or a
bare install) must not pay for it when the module is imported (support.parse_cost.HEAVY: Ray, the ML stacks,
the cloud and Kubernetes clients, and the project's own worker-side modules). Anything else is imported at
the top of its module, where a reader looks for it.

Read from the source: a project module counts as heavy when its module-level imports reach a heavy module
(the slice catalog's names are looked up where they live: tpuflow.tpu loads them on first use). A
third-party library outside the standard library and Airflow's task SDK counts as heavy (providers,
google-api-core, yaml, jsonschema, cryptography, sqlalchemy: each costs the parse something).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from support.parse_cost import HEAVY

PACKAGE = Path(__file__).resolve().parents[2] / "operators" / "tpuflow"
# what every DAG file has loaded before its first line runs
LOADED_WITH_THE_SDK = ("airflow.sdk", "airflow.sdk.exceptions")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def lazy_names(package_init: Path) -> dict[str, str]:
    """PEP 562 packages: ``{name: module}`` of the ``_WHERE`` table their ``__getattr__`` loads from."""
    for node in ast.parse(package_init.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


LAZY = {module: lazy_names(path) for module, path in MODULES.items() if path.name == "__init__.py"}


def targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads (absolute names; a package's lazy name resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    found = []
    for alias in node.names:
        child = f"{base}.{alias.name}"
        found.append(child if child in MODULES else LAZY.get(base, {}).get(alias.name, base))
    return found


def type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def module_level_imports(module: str) -> Iterator[str]:
    """What importing the module loads: its top-level imports, those under a module-level if / try too."""
    for node in ast.parse(MODULES[module].read_text()).body:
        if type_checking(node):
            continue
        block = [*node.body, *node.orelse] if isinstance(node, ast.If | ast.Try) else [node]
        for stmt in block:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                yield from targets(module, stmt)


def in_heavy_list(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in HEAVY)


@cache
def heavy(name: str) -> bool:
    """Whether importing ``name`` loads something DAG parsing must not (its parent packages included)."""
    if in_heavy_list(name):
        return True
    if name.split(".")[0] != "tpuflow":
        root = name.split(".")[0]
        return root not in sys.stdlib_module_names and name not in LOADED_WITH_THE_SDK
    if name not in MODULES:
        return False
    parents = [".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)]
    return any(heavy(t) for t in [*parents, *module_level_imports(name)] if t != name)


def function_level_imports(module: str) -> Iterator[tuple[int, str]]:
    tree = ast.parse(MODULES[module].read_text())
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(func):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    for target in targets(module, node):
                        yield node.lineno, target


def test_a_function_imports_only_what_the_module_must_not_load() -> None:
    light = sorted(
        {
            f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target}"
            for module in MODULES
            for line, target in function_level_imports(module)
            if not heavy(target)
        }
    )
    assert light == [], "import these at the top of the module (nothing heavy loads):\n" + "\n".join(light)


def test_the_rule_tells_light_from_heavy() -> None:
    assert heavy("tpuflow.gke.hooks") and heavy("ray.train") and heavy("yaml")
    assert heavy("tpuflow.tpu.slice"), "in the parse-cost list"
    assert not heavy("json") and not heavy("airflow.sdk.exceptions")
    assert not heavy("tpuflow.errors") and not heavy("tpuflow.tpu.generations")
    assert LAZY["tpuflow.tpu"]["TpuSlice"] == "tpuflow.tpu.slice"
