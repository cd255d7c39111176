"""tpuflow as production installs it: a wheel (Composer, docker/airflow.Dockerfile), not this checkout.

Fast: pyproject's explicit package list covers every package folder; the wheel carries the workloads;
the provider part never imports the simulators (tpuflow.dev). Slow: a fresh venv with the lock and the
wheel (non-editable) imports tpuflow from site-packages only and runs the local pipeline's Ray steps.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.imports import imported_modules

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOT = REPO / "operators"  # the src/ of this layout: operators/tpuflow/gke/hooks.py is tpuflow.gke.hooks
OPERATORS = SOURCE_ROOT / "tpuflow"
WORKLOADS = REPO / "workloads"
UV = Path(sys.executable).with_name("uv")
# What the Airflow image copies to build the wheel (docker/airflow.Dockerfile).
BUILD_INPUTS = ("pyproject.toml", "README.md", "operators", "workloads")


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def package_folders() -> dict[str, Path]:
    """Dotted name -> folder of every package (a folder with __init__.py) the distribution ships."""
    found = {}
    for root, prefix in ((OPERATORS, "tpuflow"), (WORKLOADS, "tpuflow.workloads")):
        for init in sorted(root.rglob("__init__.py")):
            rel = init.parent.relative_to(root).parts
            if "__pycache__" not in rel:
                found[".".join((prefix, *rel))] = init.parent
    return found


def test_every_package_folder_is_listed_in_pyproject() -> None:
    setuptools = pyproject()["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "operators", "tpuflow.workloads": "workloads"}
    listed = setuptools["packages"]
    assert len(listed) == len(set(listed)), "a package is listed twice"
    folders = package_folders()
    assert sorted(set(folders) - set(listed)) == [], "package folders missing from [tool.setuptools] packages"
    assert sorted(set(listed) - set(folders)) == [], "listed packages without a folder (or its __init__.py)"


def test_package_folders_have_no_module_without_init() -> None:
    """A folder of modules without __init__.py is not a package: setuptools would silently leave it out."""
    shipped = set(package_folders().values())
    stray = sorted(
        str(py.relative_to(REPO))
        for root in (OPERATORS, WORKLOADS)
        for py in root.rglob("*.py")
        if "__pycache__" not in py.parts and py.parent not in shipped
    )
    assert stray == [], f"modules outside any listed package (add an __init__.py and list it): {stray}"


def test_every_file_path_under_operators_is_its_import_name() -> None:
    """operators/ is the source root: a module's path below it, dots for slashes, is what imports it."""
    wrong = {}
    for py in sorted(SOURCE_ROOT.rglob("*.py")):
        rel = py.relative_to(SOURCE_ROOT).with_suffix("").parts
        if "__pycache__" in rel:
            continue
        dotted = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        spec = importlib.util.find_spec(dotted)
        if spec is None or spec.origin is None or Path(spec.origin).resolve() != py.resolve():
            wrong[str(py.relative_to(REPO))] = spec.origin if spec else None
    assert wrong == {}, f"files whose path is not their import name: {wrong}"
    top = sorted(p.name for p in SOURCE_ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    assert top == ["tpuflow"], "operators/ holds the tpuflow package and nothing else importable"


# --- the provider part never needs the simulators ---------------------------------------------

DEV_ONLY = ("dev", "cli")  # operators/tpuflow/dev/** (tpuflow.dev) and operators/tpuflow/cli/** may use the simulators


def module_name(path: Path) -> str:
    parts = path.relative_to(OPERATORS).with_suffix("").parts
    return ".".join(("tpuflow", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def package_of(path: Path) -> str:
    """The package a module's relative imports are resolved against."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def is_dev(module: str) -> bool:
    return module == "tpuflow.dev" or module.startswith("tpuflow.dev.")


def provider_modules() -> list[Path]:
    return sorted(
        p
        for p in OPERATORS.rglob("*.py")
        if p.relative_to(OPERATORS).parts[0] not in DEV_ONLY and "__pycache__" not in p.parts
    )


def test_the_import_scan_sees_every_form_of_import() -> None:
    """The scanner itself: absolute, relative, nested and dynamic imports of tpuflow.dev are all found."""
    source = (
        "import tpuflow.dev.standins\n"
        "from tpuflow import dev\n"
        "def f():\n    from ..dev.standins import gke_api\n"
        "class C:\n    def m(self):\n        import importlib\n        importlib.import_module('tpuflow.dev.demo')\n"
        "from .hooks import GkeHook\n"
        "import tpuflow.devices\n"
    )
    found = imported_modules(source, "tpuflow.gke")
    assert sorted({(line, m) for line, m in found if is_dev(m)}) == [
        (1, "tpuflow.dev.standins"),
        (2, "tpuflow.dev"),
        (4, "tpuflow.dev.standins"),
        (4, "tpuflow.dev.standins.gke_api"),
        (8, "tpuflow.dev.demo"),
    ]
    assert (9, "tpuflow.gke.hooks") in found and (10, "tpuflow.devices") in found


def test_provider_part_never_imports_the_simulators() -> None:
    modules = provider_modules()
    assert OPERATORS / "rayjob" / "operators.py" in modules and OPERATORS / "local" / "cluster.py" in modules
    assert not [p for p in modules if p.relative_to(OPERATORS).parts[0] in DEV_ONLY]
    offending = [
        f"{p.relative_to(REPO)}:{line} imports {name}"
        for p in modules
        for line, name in imported_modules(p.read_text(), package_of(p))
        if is_dev(name)
    ]
    assert offending == [], "the provider part must not need tpuflow.dev (simulators):\n" + "\n".join(offending)


# --- the wheel ----------------------------------------------------------------------------------


def build_wheel(out: Path) -> Path:
    """Build the wheel from a copy of exactly what the Airflow image copies (the checkout stays clean)."""
    src = out / "src"
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = out / "dist"
    cmd = (
        [str(UV), "build", "--wheel", "--out-dir", str(dist), str(src)]
        if UV.exists()
        else [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)]
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = sorted(dist.glob("tpuflow-*.whl"))
    assert len(wheels) == 1, f"expected one wheel, got {wheels}"
    return wheels[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_carries_the_packages_and_the_workloads(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in (WORKLOADS / "addition", WORKLOADS / "tpuflow_driver"):
        expected = {f"tpuflow/workloads/{folder.name}/{p.name}" for p in folder.glob("*.py")}
        assert expected and expected <= names, f"the wheel lacks {sorted(expected - names)}"
    for dotted in package_folders():
        assert f"{dotted.replace('.', '/')}/__init__.py" in names, f"the wheel lacks the package {dotted}"
    assert not any(n.startswith(("operators/", "workloads/")) for n in names), "the folders ship under tpuflow/ only"
    # PEP 561: type checkers read the provider's own annotations (make typecheck keeps them checked)
    assert "tpuflow/py.typed" in names, "the wheel lacks tpuflow/py.typed"
    # KubeRay's CRDs (package data): the imitation control plane's schemas wherever tpuflow is installed.
    crds = "tpuflow/dev/standins/kuberay_crds/"
    shipped = {f"{crds}{p.name}" for p in (OPERATORS / "dev" / "standins" / "kuberay_crds").iterdir() if p.is_file()}
    assert f"{crds}ray.io_rayclusters.yaml.gz" in shipped and {f"{crds}LICENSE", f"{crds}NOTICE"} <= shipped
    assert shipped <= names, f"the wheel lacks {sorted(shipped - names)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "tpuflow.provider_info:get_provider_info" in text and "tpuflow = tpuflow.cli:main" in text


# --- installed the way production installs it ---------------------------------------------------

CHECK_INSTALL = """
import importlib.util, json, sys, sysconfig
from pathlib import Path
import tpuflow
from tpuflow.dev.standins.kubernetes_catalog import CrdSchemas
from tpuflow.dev.standins.stack import default_crds
site = Path(sysconfig.get_paths()["purelib"]).resolve()
workloads = Path(tpuflow.workloads_dir()).resolve()
print(json.dumps({
    "prefix": sys.prefix,
    "site": str(site),
    "tpuflow": str(Path(tpuflow.__file__).resolve()),
    "workloads": str(workloads),
    "workloads_in_site": workloads.is_relative_to(site),
    "subfolders": sorted(p.name for p in workloads.iterdir() if p.is_dir() and p.name != "__pycache__"),
    "operators_importable": importlib.util.find_spec("operators") is not None,
    "crds": str(default_crds()),
    "crd_plurals": sorted(CrdSchemas.load(default_crds()).schemas),
    "sys_path": sys.path,
}))
import operators  # must fail: the distribution imports only as tpuflow
"""


def clean_env(home: Path) -> dict[str, str]:
    """The caller's environment without anything pointing at this checkout or another interpreter."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "RAY_", "AIRFLOW", "TPUFLOW", "PYTEST"))
    }
    env.update(
        {
            "HOME": os.environ.get("HOME", str(home)),
            "AIRFLOW_HOME": str(home / "airflow"),
            "TPUFLOW_HOME": str(home / "tpuflow"),
            "JAX_PLATFORMS": "cpu",
            "PATH": os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO))),
        }
    )
    return env


def run_in(venv: Path, args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A fresh venv holding the lock and the wheel (non-editable, --no-deps), as the Airflow image does."""
    if not UV.exists():
        pytest.fail(f"{UV} missing: `make install` installs uv into the venv")
    base = tmp_path_factory.mktemp("installed")
    venv = base / "venv"
    started = time.monotonic()
    subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    for what in (["-r", str(REPO / "requirements.lock")], ["--no-deps", str(wheel)]):
        done = subprocess.run(
            [str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *what],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=base,
        )
        assert done.returncode == 0, f"uv pip install {what} failed:\n{done.stderr[-3000:]}"
    neutral = base / "elsewhere"
    neutral.mkdir()
    yield {"venv": venv, "cwd": neutral, "env": clean_env(base), "install_s": time.monotonic() - started}


@pytest.mark.slow
def test_installed_wheel_imports_as_tpuflow_from_site_packages(installed: dict) -> None:
    venv, cwd, env = installed["venv"], installed["cwd"], installed["env"]
    done = run_in(venv, ["-c", CHECK_INSTALL], cwd, env, timeout=300)
    facts = json.loads(done.stdout.splitlines()[0]) if done.stdout.strip() else {}
    assert facts, f"the installed tpuflow did not import:\n{done.stderr[-3000:]}"
    assert Path(facts["prefix"]) == venv
    assert facts["tpuflow"].startswith(facts["site"] + "/tpuflow/"), facts["tpuflow"]
    assert facts["workloads_in_site"], f"workloads_dir() is {facts['workloads']}, outside {facts['site']}"
    assert {"addition", "tpuflow_driver"} <= set(facts["subfolders"]), facts["subfolders"]
    assert not facts["operators_importable"]
    assert facts["crds"].startswith(facts["site"] + "/tpuflow/"), facts["crds"]
    assert facts["crd_plurals"] == ["rayclusters", "raycronjobs", "rayjobs", "rayservices"], facts["crd_plurals"]
    assert done.returncode != 0 and "ModuleNotFoundError: No module named 'operators'" in done.stderr, done.stderr
    assert not any(p.startswith(str(REPO)) for p in facts["sys_path"]), f"the checkout is on sys.path: {facts}"
    # The install is the wheel's copy, not an editable pointer back here.
    pth = [p.name for p in Path(facts["site"]).glob("*.pth") if str(REPO) in p.read_text()]
    assert pth == [], f"an editable install of the checkout is in the venv: {pth}"


@pytest.mark.slow
@pytest.mark.long  # make test imports the installed wheel; this runs its Ray steps (make test-long)
def test_installed_wheel_runs_the_local_pipelines_ray_steps(installed: dict) -> None:
    """Prep (Ray Data) and train (Ray Train, JAX) from the installed wheel on a simulated v6e 2x2 slice."""
    venv, cwd, env = installed["venv"], installed["cwd"], installed["env"]
    script = cwd / "installed_ray_steps.py"
    shutil.copy(Path(__file__).with_name("installed_ray_steps.py"), script)
    work = cwd / "work"
    started = time.monotonic()
    try:
        done = run_in(venv, [str(script), str(work)], cwd, env, timeout=900)
    finally:
        leftover = _stop_leftover_cluster(work / "clusters")
    elapsed = time.monotonic() - started
    print(f"installed-wheel Ray steps: {elapsed:.0f}s (venv install {installed['install_s']:.0f}s)")
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"rc={done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    result = json.loads(lines[-1][len("RESULT ") :])
    site = str(next((venv / "lib").glob("python3.*/site-packages")))
    assert all(w.startswith(site + "/tpuflow/workloads") for w in result["working_dirs"]), result["working_dirs"]
    assert result["prep"]["train_rows"] == 2000 and result["prep"]["skipped"] is False, result["prep"]
    train = result["train"]
    assert train["checkpoint"].startswith(str(work / "train")), train
    assert set(result["pids"]) <= set(result["signalled"]), "stop() must signal every node it started"
    assert result["left"] == [] and leftover == [], f"cluster processes outlived stop(): {result['left'] or leftover}"


def _stop_leftover_cluster(base: Path) -> list[int]:
    """If the script died before stopping its cluster, stop it by the PIDs in its state file."""
    from tpuflow.local.cluster import LocalRayCluster, _pids_referencing

    left: list[int] = []
    for state in base.glob("*/state.json"):
        cluster = LocalRayCluster.load(state.parent)
        left += cluster.stop()
        assert _pids_referencing(cluster.temp_dir) == []
    return left


def test_the_lock_pins_every_dependency_and_dev_tool() -> None:
    """`make install` installs requirements.lock: everything pyproject names (but the torch extra) is pinned there,
    Playwright included (the UI tests drive Debian's Chromium with it)."""
    pinned = {
        re.sub(r"[-_.]+", "-", m.group(1)).lower()
        for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==\S+$", (REPO / "requirements.lock").read_text(), re.M)
    }
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["jax"], *extras["dev"]]  # the demo and the tests run JAX
    names = {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", req).group(0)).lower() for req in wanted}
    assert "playwright" in names and "greenlet" in pinned
    assert sorted(names - pinned) == [], "pyproject names packages the lock does not pin: re-run `uv pip compile`"
