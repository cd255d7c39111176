"""The example DAGs the how-to pages include parse cleanly and cheaply, and every snippet the docs include exists."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.parse_cost import HEAVY

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "dags"
DOCS = ROOT / "docs"
PARSE = """
import importlib.util, json, sys
import airflow.sdk
before = set(sys.modules)
spec = importlib.util.spec_from_file_location("example_under_test", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(json.dumps(sorted(set(sys.modules) - before)))
"""
# What a DAG file must not load while it is parsed, less the project's own builders: the examples write their
# slices and names as literals, which the operators check (and so build) at parse time, by design; the shipped
# pipeline DAGs template them instead (tests/dags).
THIRD_PARTY_HEAVY = tuple(h for h in HEAVY if not h.startswith("tpuflow."))
INCLUDE = re.compile(r"```\{literalinclude\}\s+(\S+)\n((?::[\w-]+:.*\n)*)")


def example_files() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("example_*.py"))


def test_every_example_dag_parses_in_a_dagbag(migrated_airflow_db: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(EXAMPLES))
    assert bag.import_errors == {}
    files = {Path(dag.fileloc).name for dag in bag.dags.values()}
    assert set(example_files()) <= files, "every example file defines at least one DAG"


@pytest.mark.parametrize("example", example_files())
def test_example_dag_imports_nothing_heavy_at_parse_time(example: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PARSE, str(EXAMPLES / example)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in THIRD_PARTY_HEAVY))
    assert heavy == [], f"{example} loads these while being parsed: {heavy}"


def included_snippets() -> list[tuple[Path, Path, dict[str, str]]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if "_build" in page.parts:
            continue
        for target, options in INCLUDE.findall(page.read_text()):
            opts = dict(re.findall(r":([\w-]+):\s*(.*)", options))
            found.append((page, (page.parent / target).resolve(), {k: v.strip().strip('"') for k, v in opts.items()}))
    return found


def test_every_included_snippet_is_an_example_dag_with_its_markers() -> None:
    snippets = included_snippets()
    assert len(snippets) >= 20
    for page, source, options in snippets:
        assert source.exists(), f"{page.relative_to(ROOT)} includes {source}, which does not exist"
        text = source.read_text()
        for key in ("start-after", "end-before"):
            assert options.get(key, "") in text, f"{page.relative_to(ROOT)}: {options.get(key)} not in {source.name}"
        start, end = text.index(options["start-after"]), text.index(options["end-before"])
        assert start < end and text[start:end].count("\n") > 1, f"{page.relative_to(ROOT)}: empty snippet"


def test_every_example_dag_is_included_by_a_how_to_page() -> None:
    used = {source.name for _, source, _ in included_snippets()}
    assert set(example_files()) <= used
