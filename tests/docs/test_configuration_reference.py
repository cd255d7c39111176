"""The generated configuration reference names every environment variable and Airflow Variable the provider reads,
and the docs' local links resolve."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operators" / "tpuflow"
# os.environ reads, also through a local name bound to it (paths.py's environ, storage.py's source), and os.getenv
READ = re.compile(
    r"""(?:\b(?:environ|source)(?:\.get|\.pop|\.setdefault)?|os\.getenv)\s*[\[(]\s*(?:["']([A-Z][A-Z0-9_]+)["']|([A-Z][A-Z0-9_]+)\b)"""
)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "_ext" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def provider_sources() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] != "dev"]


def env_names_read() -> dict[str, str]:
    """NAME -> file, for each os.environ / os.getenv read in operators/tpuflow outside the rehearsal lab: a literal
    name, or a module constant NAME_ENV = "VALUE" the read names."""
    found = {}
    for path in provider_sources():
        text = path.read_text()
        for literal, constant in READ.findall(text):
            if literal:
                found[literal] = str(path.relative_to(ROOT))
                continue
            value = re.search(rf"^{constant}\s*=\s*[\"']([A-Z][A-Z0-9_]+)[\"']", text, re.M)
            found[value.group(1) if value else constant] = str(path.relative_to(ROOT))
    return found


def test_every_environment_variable_the_provider_reads_is_in_the_reference() -> None:
    reference = "\n".join(_load("tpuflow_reference").env_rst())
    read = env_names_read()
    assert {"TPUFLOW_HOME", "TPUFLOW_OUTPUT_ROOT", "STORAGE_EMULATOR_HOST"} <= set(read)
    missing = {name: where for name, where in read.items() if f"``{name}``" not in reference}
    assert missing == {}, f"read by the provider, missing from the configuration reference: {missing}"


def test_every_airflow_variable_the_provider_reads_is_in_the_reference() -> None:
    reference = "\n".join(_load("tpuflow_reference").variables_rst())
    names = set()
    for path in provider_sources():
        names |= set(re.findall(r"""(?:var\.value\.get|\b_var)\(\s*['"](tpuflow_\w+)""", path.read_text()))
        names |= set(re.findall(r"""_VARIABLE\s*=\s*['"](tpuflow_\w+)['"]""", path.read_text()))
    assert {"tpuflow_backend", "tpuflow_max_slices", "tpuflow_gke_cluster"} <= names
    assert {n for n in names if f"``{n}``" not in reference} == set()


def test_every_pipeline_param_is_in_the_reference() -> None:
    from tpuflow.pipeline.params import param_specs

    reference = "\n".join(_load("tpuflow_reference").params_rst())
    assert {n for n in param_specs() if f"``{n}``" not in reference} == set()
    assert "``zones``" in reference and "``max_run_duration_seconds``" in reference


def test_the_readme_and_the_docs_have_no_broken_local_link(tmp_path: Path) -> None:
    links = _load("local_links")
    assert links.broken_links() == []
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[here](#a-page) [gone](missing.md) [no heading](page.md#nowhere)\n")
    (tmp_path / "missing.txt").write_text("")
    broken = links.broken_links([page])
    assert len(broken) == 2, broken
    assert broken[0].endswith("missing.md: no such file") and "no heading #nowhere" in broken[1]
