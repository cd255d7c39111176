"""The provider's layers point downward only: read from the source, every import counted (module level,
inside functions, under TYPE_CHECKING), as a reviewer following the arrows would.

Layers, lowest first (a subpackage may import its own layer's modules and any lower layer, never a higher
one, nor a sibling of its own layer):

- core: the modules at the package root (errors, naming, labels, events, triggers, links, storage, ...)
- tpu: the slice catalog
- kubernetes: where the API is, custom objects of one group, errors, value rules, the operator skeleton
- ray: a Ray cluster's dashboard address, auth and links
- gke (node pools), local (the simulated slice), slices (leases)
- capacity: ProvisioningRequest and flex-start, on GKE and Kubernetes
- rayjob (Ray jobs, training), serve (Ray Serve apps)
- kuberay: RayCluster / RayService (a RayService carries a Serve config)
- cost: budget, ledger, reaper
- pipeline (the DAG factory), ui (the plugin's pages)
- cli: the command line
- rehearsal: the second distribution (rehearsal/tpuflow_rehearsal, import root tpuflow_rehearsal): stand-ins,
  launchers, the demo and the commands that need them. Above every provider layer: nothing in tpuflow, its
  command line included, imports it (the command line finds its commands through entry points).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operators" / "tpuflow"
REHEARSAL = REPO / "rehearsal" / "tpuflow_rehearsal"
LAYERS: list[set[str]] = [
    {"core"},
    {"tpu"},
    {"kubernetes"},
    {"ray"},
    {"gke", "local", "slices"},
    {"capacity"},
    {"rayjob", "serve"},
    {"kuberay"},
    {"cost"},
    {"pipeline", "ui"},
    {"cli"},
    {"rehearsal"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for package in (PACKAGE, REHEARSAL):
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(package.parent).with_suffix("").parts
            if "__pycache__" not in parts:
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def subpackage(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "tpuflow_rehearsal":
        return "rehearsal"  # one layer: its own subpackages import one another freely
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "core"


def imported(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(tpuflow module imported, line) for every import statement of the file, wherever it stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # `from pkg import mod` imports the submodule; `from mod import name` the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in ("tpuflow", "tpuflow_rehearsal"):
                yield target, node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    for module, path in MODULES.items():
        for target, line in imported(module, path):
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]  # tpuflow.x.name -> the module tpuflow.x
            if target != module:
                graph[module].setdefault(target, line)
    return graph


GRAPH = import_graph()


def test_every_subpackage_has_a_layer() -> None:
    assert {subpackage(m) for m in MODULES} == set(RANK), "a new subpackage: give it a layer in LAYERS"


def test_no_module_imports_a_higher_layer_or_a_sibling() -> None:
    wrong = [
        f"{module} -> {target} (line {line})"
        for module, targets in GRAPH.items()
        for target, line in targets.items()
        if subpackage(module) != subpackage(target) and RANK[subpackage(target)] >= RANK[subpackage(module)]
    ]
    assert wrong == []


def test_no_import_cycle_between_files() -> None:
    """Tarjan's strongly connected components over the file graph: every one is a single file."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in GRAPH.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                cycles.append(sorted([node, *component]))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert cycles == []


# what a module may not import, unless it is in one of these layers
FORBIDDEN = {
    "tpuflow_rehearsal": {"rehearsal"},  # the provider, its command line included, never needs the rehearsal
    "tpuflow.dev": set(),  # the rehearsal's old home inside the provider: gone for good
    "tpuflow.cli": {"cli", "rehearsal"},
    "tpuflow.workloads": {"cli", "rehearsal"},
}


@pytest.mark.parametrize("forbidden", sorted(FORBIDDEN))
def test_provider_modules_never_import_the_rehearsal_the_cli_or_the_workloads(forbidden: str) -> None:
    """tpuflow.workloads is shipped to Ray (the examples and the driver); `tpuflow.workloads_dir()` finds it."""
    wrong = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if subpackage(module) not in FORBIDDEN[forbidden]
        for target in targets
        if target == forbidden or target.startswith(forbidden + ".")
    ]
    assert wrong == []


def test_the_rehearsal_is_in_the_graph_above_the_provider() -> None:
    """The scan reads the rehearsal's files too (they import the provider: arrows pointing down)."""
    assert "tpuflow_rehearsal.demo" in MODULES and "tpuflow_rehearsal.cli.run_cmd" in MODULES
    assert subpackage("tpuflow_rehearsal.standins.gke_api") == "rehearsal" and LAYERS[-1] == {"rehearsal"}
    assert any(t.startswith("tpuflow.") for t in GRAPH["tpuflow_rehearsal.demo"])
    assert not any(t.startswith("tpuflow_rehearsal") for m, ts in GRAPH.items() if m.startswith("tpuflow.") for t in ts)


def test_the_checks_see_imports_inside_functions() -> None:
    """A lazy import (kept out of DAG parsing) is an arrow all the same: the graph holds those too."""
    local_operators = GRAPH["tpuflow.kuberay.operator_base"]
    assert "tpuflow.kuberay.hooks" in local_operators  # imported inside a method only
    assert "tpuflow.kubernetes.operator_base" in local_operators
