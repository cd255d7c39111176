"""The stand-ins must not share their oracle with the system under test.

Every module under rehearsal/tpuflow_rehearsal/standins (tpuflow_rehearsal.standins) and rehearsal/tpuflow_rehearsal/nodes (GKE's
nodes and TPU webhook on the real control plane) may import the standard library,
third-party packages and tpuflow_rehearsal.* only (tpuflow.errors is tolerated): nothing of the operator
side (tpuflow.kuberay, tpuflow.tpu, tpuflow.gke, ...), at module level or inside a function.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.imports import imported_modules

DEV = Path(__file__).resolve().parents[3] / "rehearsal" / "tpuflow_rehearsal"
STANDINS = DEV / "standins"
PACKAGE = "tpuflow_rehearsal.standins"
ALLOWED = ("tpuflow_rehearsal", "tpuflow.errors")


def _module_name(path: Path) -> str:
    parts = path.relative_to(DEV).with_suffix("").parts
    return ".".join(("tpuflow_rehearsal", *(p for p in parts if p != "__init__")))


def _imports(path: Path) -> list[tuple[int, str]]:
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    return imported_modules(path.read_text(), package)


def _forbidden(module: str) -> bool:
    if module != "tpuflow" and not module.startswith("tpuflow."):
        return False  # tpuflow_rehearsal.* is the stand-ins' own package
    return not any(module == ok or module.startswith(ok + ".") for ok in ALLOWED)


MODULES = sorted([*STANDINS.rglob("*.py"), *(DEV / "nodes").rglob("*.py")])


def test_the_stand_ins_are_found() -> None:
    names = {_module_name(p) for p in MODULES}
    assert {
        f"{PACKAGE}.gke_api",
        f"{PACKAGE}.kubernetes_api",
        f"{PACKAGE}.kuberay_controller.webhook",
        f"{PACKAGE}.kuberay_controller.services",
        "tpuflow_rehearsal.nodes.tpu_webhook",
        "tpuflow_rehearsal.nodes.agent",
    } <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(DEV)))
def test_a_stand_in_imports_nothing_from_the_operator_side(path: Path) -> None:
    bad = [f"line {line}: {module}" for line, module in _imports(path) if _forbidden(module)]
    assert bad == [], f"{path.name} imports the system under test: {bad}"


def test_the_check_catches_operator_imports() -> None:
    source = (
        "import json\nfrom tpuflow_rehearsal.standins import gke_tpu\nfrom . import state\n\ndef f():\n"
        "    from tpuflow.kuberay.status import x\n    import tpuflow.tpu.slice\n"
    )
    found = imported_modules(source, f"{PACKAGE}.kuberay_controller")
    assert (3, f"{PACKAGE}.kuberay_controller") in found
    assert [m for _, m in found if _forbidden(m)] == [
        "tpuflow.kuberay.status",
        "tpuflow.kuberay.status.x",
        "tpuflow.tpu.slice",
    ]
    assert _forbidden("tpuflow.tpu") and _forbidden("tpuflow") and not _forbidden("tpuflow.errors")
    assert not _forbidden("tpuflow_rehearsal.standins.kubernetes_api") and not _forbidden("yaml")
