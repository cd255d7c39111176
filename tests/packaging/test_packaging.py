"""tpuflow as production installs it: a wheel (Composer, docker/airflow.Dockerfile), not this checkout.

Two distributions, one repository: `tpuflow` (operators/, the provider and its pipelines) and `tpuflow-rehearsal`
(rehearsal/, import root tpuflow_rehearsal: stand-ins, launchers, `tpuflow demo`). Fast: each pyproject's
explicit package list covers every package folder; the provider wheel carries the workloads and none of the
rehearsal; the provider, its command line included, never imports the rehearsal. Slow: a fresh venv with the
lock and the provider wheel alone (non-editable) imports every operator from site-packages, parses every
shipped DAG, runs `tpuflow --help` (and `tpuflow demo` says what to install), and runs the local pipeline's Ray
steps.
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
# the rehearsal distribution's source root: rehearsal/tpuflow_rehearsal/demo.py is tpuflow_rehearsal.demo
REHEARSAL_ROOT = REPO / "rehearsal"
REHEARSAL = REHEARSAL_ROOT / "tpuflow_rehearsal"
UV = Path(sys.executable).with_name("uv")
# What the Airflow image copies to build the wheel (docker/airflow.Dockerfile).
BUILD_INPUTS = ("pyproject.toml", "README.md", "operators", "workloads")


def pyproject(root: Path = REPO) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())


def package_folders(roots: tuple[tuple[Path, str], ...] = ((OPERATORS, "tpuflow"), (WORKLOADS, "tpuflow.workloads"))):
    """Dotted name -> folder of every package (a folder with __init__.py) the distribution ships."""
    found = {}
    for root, prefix in roots:
        for init in sorted(root.rglob("__init__.py")):
            rel = init.parent.relative_to(root).parts
            if "__pycache__" not in rel:
                found[".".join((prefix, *rel))] = init.parent
    return found


def rehearsal_folders() -> dict[str, Path]:
    return package_folders(((REHEARSAL, "tpuflow_rehearsal"),))


@pytest.mark.parametrize(
    ("root", "package_dir", "folders"),
    [
        (REPO, {"": "operators", "tpuflow.workloads": "workloads"}, package_folders),
        (REHEARSAL_ROOT, {"": "."}, rehearsal_folders),
    ],
    ids=["tpuflow", "tpuflow-rehearsal"],
)
def test_every_package_folder_is_listed_in_pyproject(root: Path, package_dir: dict, folders) -> None:
    setuptools = pyproject(root)["tool"]["setuptools"]
    assert setuptools["package-dir"] == package_dir
    listed = setuptools["packages"]
    assert len(listed) == len(set(listed)), "a package is listed twice"
    found = folders()
    assert sorted(set(found) - set(listed)) == [], "package folders missing from [tool.setuptools] packages"
    assert sorted(set(listed) - set(found)) == [], "listed packages without a folder (or its __init__.py)"


def test_package_folders_have_no_module_without_init() -> None:
    """A folder of modules without __init__.py is not a package: setuptools would silently leave it out."""
    shipped = set(package_folders().values()) | set(rehearsal_folders().values())
    stray = sorted(
        str(py.relative_to(REPO))
        for root in (OPERATORS, WORKLOADS, REHEARSAL)
        for py in root.rglob("*.py")
        if "__pycache__" not in py.parts and py.parent not in shipped
    )
    assert stray == [], f"modules outside any listed package (add an __init__.py and list it): {stray}"


@pytest.mark.parametrize(("root", "package"), [(SOURCE_ROOT, "tpuflow"), (REHEARSAL_ROOT, "tpuflow_rehearsal")])
def test_every_file_path_under_a_source_root_is_its_import_name(root: Path, package: str) -> None:
    """operators/ and rehearsal/ are source roots: a module's path below one, dots for slashes, is what imports it."""
    wrong = {}
    for py in sorted(root.rglob("*.py")):
        rel = py.relative_to(root).with_suffix("").parts
        if "__pycache__" in rel:
            continue
        dotted = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        spec = importlib.util.find_spec(dotted)
        if spec is None or spec.origin is None or Path(spec.origin).resolve() != py.resolve():
            wrong[str(py.relative_to(REPO))] = spec.origin if spec else None
    assert wrong == {}, f"files whose path is not their import name: {wrong}"
    top = sorted(p.name for p in root.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    assert top == [package], f"{root.name}/ holds the {package} package and nothing else importable"


def test_the_old_home_of_the_rehearsal_is_gone() -> None:
    assert not (OPERATORS / "dev").exists() and importlib.util.find_spec("tpuflow.dev") is None


# --- the provider never needs the rehearsal ---------------------------------------------------


def module_name(path: Path) -> str:
    parts = path.relative_to(OPERATORS).with_suffix("").parts
    return ".".join(("tpuflow", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def package_of(path: Path) -> str:
    """The package a module's relative imports are resolved against."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def is_rehearsal(module: str) -> bool:
    """The rehearsal distribution, or its old home inside the provider."""
    return any(module == root or module.startswith(root + ".") for root in ("tpuflow_rehearsal", "tpuflow.dev"))


def provider_modules() -> list[Path]:
    """Every module of the provider distribution, its command line included."""
    return sorted(p for p in OPERATORS.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_import_scan_sees_every_form_of_import() -> None:
    """The scanner itself: absolute, nested and dynamic imports of the rehearsal are all found."""
    source = (
        "import tpuflow_rehearsal.standins\n"
        "from tpuflow_rehearsal import demo\n"
        "def f():\n    from tpuflow_rehearsal.standins import gke_api\n"
        "class C:\n    def m(self):\n        import importlib\n        importlib.import_module('tpuflow_rehearsal.demo')\n"
        "from .hooks import GkeHook\n"
        "import tpuflow_rehearsals\n"
        "from ..dev import standins\n"
    )
    found = imported_modules(source, "tpuflow.gke")
    assert sorted({(line, m) for line, m in found if is_rehearsal(m)}) == [
        (1, "tpuflow_rehearsal.standins"),
        (2, "tpuflow_rehearsal"),
        (2, "tpuflow_rehearsal.demo"),
        (4, "tpuflow_rehearsal.standins"),
        (4, "tpuflow_rehearsal.standins.gke_api"),
        (8, "tpuflow_rehearsal.demo"),
        (11, "tpuflow.dev"),
        (11, "tpuflow.dev.standins"),
    ]
    assert (9, "tpuflow.gke.hooks") in found and (10, "tpuflow_rehearsals") in found


def test_the_provider_never_imports_the_rehearsal() -> None:
    modules = provider_modules()
    assert OPERATORS / "rayjob" / "operators.py" in modules and OPERATORS / "local" / "cluster.py" in modules
    assert OPERATORS / "cli" / "__init__.py" in modules, "the command line is the provider's too"
    offending = [
        f"{p.relative_to(REPO)}:{line} imports {name}"
        for p in modules
        for line, name in imported_modules(p.read_text(), package_of(p))
        if is_rehearsal(name)
    ]
    assert offending == [], "the provider must not need tpuflow_rehearsal:\n" + "\n".join(offending)


# --- the wheels ---------------------------------------------------------------------------------


def build_wheel(out: Path, inputs: tuple[str, ...] = BUILD_INPUTS, root: Path = REPO, name: str = "tpuflow") -> Path:
    """Build a wheel from a copy of exactly what its image copies (the checkout stays clean)."""
    src = out / "src"
    for input_name in inputs:
        if (root / input_name).is_dir():
            shutil.copytree(
                root / input_name, src / input_name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            )
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / input_name, src / input_name)
    dist = out / "dist"
    cmd = (
        [str(UV), "build", "--wheel", "--out-dir", str(dist), str(src)]
        if UV.exists()
        else [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)]
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = sorted(dist.glob(f"{name.replace('-', '_')}-*.whl"))
    assert len(wheels) == 1, f"expected one wheel, got {wheels}"
    return wheels[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def rehearsal_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(
        tmp_path_factory.mktemp("rehearsal-wheel"),
        ("pyproject.toml", "tpuflow_rehearsal"),
        REHEARSAL_ROOT,
        "tpuflow-rehearsal",
    )


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
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "tpuflow.provider_info:get_provider_info" in text and "tpuflow = tpuflow.cli:main" in text


# What the provider wheel must never hold: the rehearsal (stand-ins, launchers, demo; in either home), the
# KubeRay CRDs it serves and the seed examples (examples/workloads). Listed from the wheel's own file names.
NOT_THE_PROVIDER = ("tpuflow/dev/", "tpuflow_rehearsal/", "tpuflow/workloads/seed_", "examples/")


def test_the_provider_wheel_holds_no_stand_in_launcher_or_demo(wheel: Path) -> None:
    names = sorted(zipfile.ZipFile(wheel).namelist())
    assert "tpuflow/cli/__init__.py" in names and "tpuflow/gke/operators.py" in names, names[:20]
    wrong = [
        n
        for n in names
        if n.startswith(NOT_THE_PROVIDER)
        or n.endswith((".yaml.gz", ".yaml"))
        or Path(n).stem in ("demo", "demo_gke", "gcs_emulator", "metadata_server", "standins_cmd", "run_cmd")
    ]
    assert wrong == [], f"the provider wheel holds rehearsal files: {wrong}"


def test_the_rehearsal_wheel_carries_the_lab_its_crds_and_its_commands(rehearsal_wheel: Path) -> None:
    names = set(zipfile.ZipFile(rehearsal_wheel).namelist())
    for dotted in rehearsal_folders():
        assert f"{dotted.replace('.', '/')}/__init__.py" in names, f"the wheel lacks the package {dotted}"
    assert not any(n.startswith(("tpuflow/", "rehearsal/")) for n in names), sorted(names)[:10]
    # KubeRay's CRDs (package data): the imitation control plane's schemas wherever the rehearsal is installed.
    crds = "tpuflow_rehearsal/standins/kuberay_crds/"
    shipped = {f"{crds}{p.name}" for p in (REHEARSAL / "standins" / "kuberay_crds").iterdir() if p.is_file()}
    assert f"{crds}ray.io_rayclusters.yaml.gz" in shipped and {f"{crds}LICENSE", f"{crds}NOTICE"} <= shipped
    assert shipped <= names, f"the wheel lacks {sorted(shipped - names)}"
    assert "tpuflow_rehearsal/controlplane/crds/autoscaling.x-k8s.io_provisioningrequests.yaml" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(rehearsal_wheel).read(entry_points).decode()
    commands = pyproject(REHEARSAL_ROOT)["project"]["entry-points"]["tpuflow.commands"]
    assert {"demo", "run", "airflow", "standins", "local.gcs"} <= set(commands)
    assert "[tpuflow.commands]" in text and all(f"{name} = {value}" in text for name, value in commands.items())


# --- installed the way production installs it ---------------------------------------------------

CHECK_INSTALL = """
import importlib, importlib.util, json, pkgutil, sys, sysconfig
from pathlib import Path
import tpuflow
from airflow.sdk import BaseOperator, DAG
site = Path(sysconfig.get_paths()["purelib"]).resolve()
workloads = Path(tpuflow.workloads_dir()).resolve()
# every provider module (the workloads run on Ray, with the ML stacks the Ray image has): every operator in them
modules = [m.name for m in pkgutil.walk_packages(tpuflow.__path__, "tpuflow.")
           if not m.name.startswith("tpuflow.workloads") and not m.name.endswith(".__main__")]
operators = set()
for name in modules:
    module = importlib.import_module(name)
    operators |= {f"{name}.{k}" for k, v in vars(module).items()
                  if isinstance(v, type) and issubclass(v, BaseOperator) and v.__module__ == name}
# every shipped DAG file parses from the bare provider (argv: the files)
dags = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dags[Path(path).name] = sorted(v.dag_id for v in vars(module).values() if isinstance(v, DAG))
print(json.dumps({
    "prefix": sys.prefix,
    "site": str(site),
    "tpuflow": str(Path(tpuflow.__file__).resolve()),
    "workloads": str(workloads),
    "workloads_in_site": workloads.is_relative_to(site),
    "subfolders": sorted(p.name for p in workloads.iterdir() if p.is_dir() and p.name != "__pycache__"),
    "operators_importable": importlib.util.find_spec("operators") is not None,
    "rehearsal_importable": importlib.util.find_spec("tpuflow_rehearsal") is not None,
    "modules": modules,
    "operators": sorted(operators),
    "dags": dags,
    "loaded": sorted(m for m in sys.modules if m.startswith(("tpuflow_rehearsal", "tpuflow.dev"))),
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


def provider_operator_modules() -> set[str]:
    """Modules of the checkout that define an operator class (read from the source)."""
    return {
        module_name(p)
        for p in provider_modules()
        if p.relative_to(OPERATORS).parts[0] != "workloads" and re.search(r"^class \w+Operator\b", p.read_text(), re.M)
    }


@pytest.mark.slow
def test_installed_wheel_imports_as_tpuflow_from_site_packages(installed: dict) -> None:
    """The provider wheel alone (no rehearsal): every module and operator imports, every shipped DAG parses."""
    venv, cwd, env = installed["venv"], installed["cwd"], installed["env"]
    dag_files = [str(p) for p in sorted((REPO / "dags").glob("*.py"))]
    done = run_in(venv, ["-c", CHECK_INSTALL, *dag_files], cwd, env, timeout=300)
    facts = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    assert facts, f"the installed tpuflow did not import:\n{done.stderr[-3000:]}"
    assert Path(facts["prefix"]) == venv
    assert facts["tpuflow"].startswith(facts["site"] + "/tpuflow/"), facts["tpuflow"]
    assert facts["workloads_in_site"], f"workloads_dir() is {facts['workloads']}, outside {facts['site']}"
    assert {"addition", "tpuflow_driver"} <= set(facts["subfolders"]), facts["subfolders"]
    assert not facts["operators_importable"]
    assert not facts["rehearsal_importable"] and facts["loaded"] == [], facts["loaded"]
    wanted = provider_operator_modules()
    assert "tpuflow.gke.operators" in wanted and wanted <= set(facts["modules"]), sorted(wanted - set(facts["modules"]))
    defined = {name.rpartition(".")[0] for name in facts["operators"]}
    assert wanted <= defined, f"modules whose operators did not import: {sorted(wanted - defined)}"
    assert len(facts["operators"]) >= 25, facts["operators"]
    assert set(facts["dags"]) == {Path(p).name for p in dag_files} and all(facts["dags"].values()), facts["dags"]
    assert done.returncode != 0 and "ModuleNotFoundError: No module named 'operators'" in done.stderr, done.stderr
    assert not any(p.startswith(str(REPO)) for p in facts["sys_path"]), f"the checkout is on sys.path: {facts}"
    # The install is the wheel's copy, not an editable pointer back here.
    pth = [p.name for p in Path(facts["site"]).glob("*.pth") if str(REPO) in p.read_text()]
    assert pth == [], f"an editable install of the checkout is in the venv: {pth}"


@pytest.mark.slow
def test_installed_wheel_runs_its_command_line_without_the_rehearsal(installed: dict) -> None:
    """`tpuflow --help` lists every command; a rehearsal command says, in one line, what to install."""
    venv, cwd, env = installed["venv"], installed["cwd"], installed["env"]
    tpuflow = str(venv / "bin" / "tpuflow")
    helped = subprocess.run([tpuflow, "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr[-3000:]
    for command in ("slice", "local", "render", "reap", "leases", "demo", "run", "standins", "airflow"):
        assert command in helped.stdout, helped.stdout
    for argv in (["demo"], ["demo", "--framework", "torch"], ["local", "gcs", "up"]):
        done = subprocess.run([tpuflow, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stdout == "", (argv, done.stdout, done.stderr[-3000:])
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert "tpuflow-rehearsal" in done.stderr and "is not installed" in done.stderr, done.stderr
    sliced = subprocess.run(
        [tpuflow, "slice", "--accelerator", "tpu-v6e-slice", "--topology", "2x4", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sliced.returncode == 0 and json.loads(sliced.stdout), sliced.stderr[-3000:]


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
    """`make install` installs requirements.lock: everything either pyproject names (but the torch extra) is pinned there,
    Playwright included (the UI tests drive Debian's Chromium with it)."""
    pinned = {
        re.sub(r"[-_.]+", "-", m.group(1)).lower()
        for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==\S+$", (REPO / "requirements.lock").read_text(), re.M)
    }
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["jax"], *extras["dev"]]  # the demo and the tests run JAX
    # and what the rehearsal distribution needs (`make install` installs it with --no-deps too)
    wanted += [req for req in pyproject(REHEARSAL_ROOT)["project"]["dependencies"] if req != "tpuflow"]
    names = {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", req).group(0)).lower() for req in wanted}
    assert "playwright" in names and "greenlet" in pinned
    assert sorted(names - pinned) == [], "pyproject names packages the lock does not pin: re-run `uv pip compile`"
