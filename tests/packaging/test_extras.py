"""The provider without its extras: jax, jaxlib, optax and torch are extras ([jax], [torch]) that only the
workloads (on Ray) and bench/ import, so every provider module imports, and the shipped DAG files and the UI
plugin load, with those libraries unimportable. Airflow is a range in the package metadata (the lock stays exact).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from support.python_packages import write_package

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOT = REPO / "operators"  # operators/tpuflow/gke/hooks.py is tpuflow.gke.hooks
ML_STACKS = ("jax", "jaxlib", "optax", "torch")

# Run in a fresh interpreter: a meta-path finder makes the ML stacks unimportable (raising as if they were not
# installed) and records who asked, so an import swallowed by `try/except ImportError` is caught too.
BLOCKED_IMPORT_RUN = """
import importlib, importlib.abc, importlib.util, json, sys
from pathlib import Path

config = json.loads(sys.argv[1])
blocked, attempts = tuple(config["blocked"]), []


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in blocked:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back
        attempts.append([name, frame.f_code.co_filename if frame else "?"])
        raise ModuleNotFoundError(f"No module named {name!r} (blocked: not installed without extras)", name=name)


sys.meta_path.insert(0, Blocker())
errors, modules = {}, []
root = Path(config["source_root"])
sys.path.insert(0, str(root))
for path in sorted((root / config["package"]).rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    if path.name == "__main__.py" or "__pycache__" in parts or parts[:2] in [tuple(s.split(".")) for s in config["skip"]]:
        continue
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    modules.append(name)
    try:
        importlib.import_module(name)
    except BaseException as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
for path in map(Path, config["plugin_files"]):
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except BaseException as exc:
        errors[str(path)] = f"{type(exc).__name__}: {exc}"
dag_ids, dag_errors = [], {}
if config["dag_folder"]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=config["dag_folder"])
    dag_ids, dag_errors = sorted(bag.dag_ids), {str(k): str(v)[-2000:] for k, v in bag.import_errors.items()}
print("RESULT " + json.dumps({"modules": modules, "errors": errors, "attempts": attempts,
                              "dag_ids": dag_ids, "dag_errors": dag_errors}))
"""


def run_blocked(source_root: Path, package: str, dag_folder: Path | None = None, plugin_files: tuple = ()) -> dict:
    config = {
        "blocked": ML_STACKS,
        "source_root": str(source_root),
        "package": package,
        # tpuflow.workloads lives in workloads/ and runs on Ray, with the extras installed there
        "skip": ["tpuflow.workloads"],
        "dag_folder": str(dag_folder) if dag_folder else "",
        "plugin_files": [str(p) for p in plugin_files],
    }
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT_RUN, json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=source_root,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"rc={done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_every_provider_module_imports_and_the_dags_parse_without_the_ml_extras() -> None:
    result = run_blocked(SOURCE_ROOT, "tpuflow", REPO / "dags", tuple(sorted((REPO / "plugins").glob("*.py"))))
    assert len(result["modules"]) > 50 and "tpuflow.gke.hooks" in result["modules"], result["modules"]
    assert result["errors"] == {}, f"modules that need an extra to import: {result['errors']}"
    ours = [a for a in result["attempts"] if a[1].startswith(str(REPO))]
    assert ours == [], f"imported at module level (import them inside the function that uses them): {ours}"
    assert result["dag_errors"] == {}, result["dag_errors"]
    assert set(result["dag_ids"]) >= {"tpu_llm_pipeline_local", "tpu_llm_pipeline_gke", "tpuflow_reaper"}


def test_the_blocked_run_reports_module_level_ml_imports_and_leaves_function_level_ones(tmp_path: Path) -> None:
    modules = {
        "top": "import optax\n",
        "swallowed": "try:\n    import torch.nn\nexcept ImportError:\n    torch = None\n",
        "lazy": "def train():\n    import jax\n\n    return jax\n",
        "plain": "import json\n",
    }
    write_package(tmp_path, "heavyprobe", modules)
    result = run_blocked(tmp_path, "heavyprobe")
    assert set(result["modules"]) == {
        "heavyprobe",
        "heavyprobe.top",
        "heavyprobe.swallowed",
        "heavyprobe.lazy",
        "heavyprobe.plain",
    }
    assert set(result["errors"]) == {"heavyprobe.top"} and "optax" in result["errors"]["heavyprobe.top"]
    assert sorted((name, Path(file).name) for name, file in result["attempts"]) == [
        ("optax", "top.py"),
        ("torch", "swallowed.py"),
    ]


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_core_dependencies_leave_the_ml_stacks_to_extras_and_take_airflow_as_a_range() -> None:
    project = _project()
    core = {Requirement(r).name.lower(): Requirement(r) for r in project["dependencies"]}
    assert not set(ML_STACKS) & set(core), f"core dependencies name {sorted(set(ML_STACKS) & set(core))}: use extras"
    extras = {
        name: {Requirement(r).name.lower() for r in reqs} for name, reqs in project["optional-dependencies"].items()
    }
    assert {"jax", "jaxlib", "optax"} <= extras.get("jax", set()), extras
    assert "torch" in extras.get("torch", set()) and "dev" in extras, extras
    for name in (
        "apache-airflow",
        "apache-airflow-providers-google",
        "apache-airflow-providers-cncf-kubernetes",
        "ray",
    ):
        operators = {spec.operator for spec in core[name].specifier}
        assert "==" not in operators and "===" not in operators, f"{core[name]}: a provider pins no exact version"
        assert ">=" in operators and "<" in operators, f"{core[name]}: give a lower and an upper bound"
