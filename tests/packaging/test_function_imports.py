"""An import inside a function is there for one reason: the module must not pay for what it loads when it is
imported. A module the shipped DAGs load while parsing keeps out what parsing does not otherwise load (the
dag processor parses every file again and again), and so does a module the ``tpuflow`` command loads at its
start (every subcommand's module, before one runs); a worker-side module (hooks, triggers, the dev tools) keeps
out only what is heavy (support.parse_cost.HEAVY: Ray, the ML stacks, the cloud and Kubernetes clients, the
project's worker-side modules; and any third-party library outside the standard library and the task SDK).
Anything else is imported at the top of its module, where a reader looks for it.

Read from the source, with what each shipped DAG loads measured by parsing it: a project module counts as
heavy when its module-level imports reach a heavy one (the slice catalog's names are looked up where they
live: tpuflow.tpu loads them on first use).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from support.parse_cost import HEAVY

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operators" / "tpuflow"
# the rehearsal distribution (rehearsal/tpuflow_rehearsal): its modules follow the same rule
REHEARSAL = REPO / "rehearsal" / "tpuflow_rehearsal"
PROJECT_ROOTS = ("tpuflow", "tpuflow_rehearsal")
# what every DAG file has loaded before its first line runs
LOADED_WITH_THE_SDK = ("airflow.sdk", "airflow.sdk.exceptions")


def source_root(path: Path) -> Path:
    """The source root a module's path is relative to (operators/ or rehearsal/)."""
    return PACKAGE.parent if path.is_relative_to(PACKAGE) else REHEARSAL.parent


def module_name(path: Path) -> str:
    parts = path.relative_to(source_root(path)).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    module_name(p): p for package in (PACKAGE, REHEARSAL) for p in package.rglob("*.py") if "__pycache__" not in p.parts
}


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
    if name.split(".")[0] not in PROJECT_ROOTS:
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


PARSE = """
import importlib.util, json, sys
import airflow.sdk
before = set(sys.modules)
spec = importlib.util.spec_from_file_location("dag_under_test", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(json.dumps(sorted(set(sys.modules) - before)))
"""


# The `tpuflow` command's start: every subcommand's module is imported before one runs (the rehearsal's too,
# through the entry points its parser loads).
CLI_START = """
import json, sys
before = set(sys.modules)
import tpuflow.cli
tpuflow.cli.build_parser()
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded_by(*argv: str) -> frozenset[str]:
    out = subprocess.run([sys.executable, "-c", *argv], capture_output=True, text=True, check=True)
    return frozenset(json.loads(out.stdout.splitlines()[-1]))


@cache
def parse_loads() -> tuple[frozenset[str], ...]:
    """What each entry point loads before it does any work: parsing each shipped DAG file (a fresh
    interpreter that imported airflow.sdk first) and the ``tpuflow`` command's start."""
    dags = [loaded_by(PARSE, str(dag)) for dag in sorted((REPO / "dags").glob("*.py"))]
    return (*dags, loaded_by(CLI_START))


def needless(module: str, target: str) -> bool:
    """Whether importing ``target`` at the top of ``module`` would cost nothing worth deferring."""
    parsing = [loads for loads in parse_loads() if module in loads]
    if target.split(".")[0] in sys.stdlib_module_names:
        return True
    if parsing:  # an entry point loads it: deferring pays off for what one of them would otherwise not load
        return all(target in loads for loads in parsing)
    return not heavy(target)


def test_a_function_imports_only_what_its_module_must_not_load() -> None:
    needless_ones = sorted(
        {
            f"{MODULES[module].relative_to(REPO)}:{line} imports {target}"
            for module in MODULES
            for line, target in function_level_imports(module)
            if needless(module, target)
        }
    )
    assert needless_ones == [], "import these at the top of the module:\n" + "\n".join(needless_ones)


def test_the_rule_tells_light_from_heavy() -> None:
    assert needless("tpuflow.gke.hooks", "json") and needless("tpuflow.gke.hooks", "tpuflow.errors")
    assert not needless("tpuflow.gke.hooks", "google.api_core.exceptions")
    assert not needless("tpuflow.gke.operators", "tpuflow.gke.hooks"), "a parse-time module defers the hook"
    assert needless("tpuflow.gke.operators", "tpuflow.errors"), "every DAG that loads it has loaded errors"
    assert not needless("tpuflow.cli.reap_cmd", "tpuflow.cost.reaper"), "the command's start stays light"
    assert heavy("tpuflow.gke.hooks") and heavy("ray.train") and heavy("yaml")
    assert heavy("tpuflow.tpu.slice"), "in the parse-cost list"
    assert not heavy("json") and not heavy("airflow.sdk.exceptions")
    assert not heavy("tpuflow.errors") and not heavy("tpuflow.tpu.generations")
    assert LAZY["tpuflow.tpu"]["TpuSlice"] == "tpuflow.tpu.slice"
