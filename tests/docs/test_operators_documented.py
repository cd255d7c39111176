"""Every operator the provider offers is named on a how-to page (docs/howto/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operators" / "tpuflow"
# Not the provider's surface: the rehearsal lab (tpuflow.dev before the split) and the command line.
PRIVATE = ("dev", "cli")
# Skeletons subclasses build on, never used in a DAG by themselves.
BASES = {"KubeRayApplyOperator"}


# tpuflow.deprecations: what an old operator name's __init__ calls first (renamed, or replaced by an argument)
ALIAS_WARNINGS = {"warn_renamed", "warn_replaced"}


def _is_deprecated_alias(node: ast.ClassDef) -> bool:
    """An operator kept one release under its old name: its __init__ warns through tpuflow.deprecations."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    return any(getattr(c.func, "id", getattr(c.func, "attr", "")) in ALIAS_WARNINGS for c in calls)


def provider_operators() -> dict[str, str]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in PRIVATE:
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef) or not re.fullmatch(r"\w+Operator", node.name):
                continue
            if node.name.startswith("_") or "Base" in node.name or node.name in BASES or _is_deprecated_alias(node):
                continue
            found[node.name] = str(path.relative_to(ROOT))
    return found


def test_the_scan_finds_the_operators() -> None:
    operators = provider_operators()
    assert {"GKECreateTPUNodePoolOperator", "KubeRayCreateClusterOperator", "RayTrainOperator"} <= set(operators)
    assert "KubeRayBaseOperator" not in operators and "KubernetesBaseOperator" not in operators


def test_every_operator_is_named_on_a_how_to_page() -> None:
    pages = {p: p.read_text() for p in sorted((ROOT / "docs" / "howto").glob("*.md"))}
    missing = {
        name: where
        for name, where in provider_operators().items()
        if not any(re.search(rf"\b{name}\b", text) for text in pages.values())
    }
    assert missing == {}, f"operators no how-to page names (docs/howto/*.md): {missing}"
