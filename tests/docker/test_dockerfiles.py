"""The Dockerfiles (not buildable here: no Docker engine) parse, and their bases agree with the lock."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
LOCK = REPO / "requirements.lock"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        assert keyword.isupper(), f"{path.name}: cannot parse {line!r}"
        out.append((keyword, args.strip()))
    assert not pending, f"{path.name}: ends inside a continued line"
    return out


def lock_version(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)$", LOCK.read_text(), re.MULTILINE)
    assert match, f"{name} is not pinned in requirements.lock"
    return match.group(1)


def lock_python() -> str:
    match = re.search(r"--python-version (\d+\.\d+)", LOCK.read_text().splitlines()[0])
    assert match, "the lock's header should name its --python-version"
    return match.group(1)


def base_image(path: Path) -> str:
    froms = [args for kw, args in instructions(path) if kw == "FROM"]
    assert len(froms) == 1, f"{path.name}: expected one FROM, got {froms}"
    return froms[0]


DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def test_the_three_images_exist() -> None:
    assert {p.name for p in DOCKERFILES} == {"airflow.Dockerfile", "ray-tpu.Dockerfile", "ray-cpu.Dockerfile"}


def test_airflow_base_matches_the_lock() -> None:
    image = base_image(DOCKER / "airflow.Dockerfile")
    assert image == f"apache/airflow:{lock_version('apache-airflow')}-python{lock_python()}"
    runs = " ".join(args for kw, args in instructions(DOCKER / "airflow.Dockerfile") if kw == "RUN")
    assert "-c /opt/tpuflow/requirements.lock /opt/tpuflow" in runs, "the project goes in under the lock's pins"
    # The lock also pins the [jax] and [dev] extras (the project's own installs): as requirements (-r) it
    # would put JAX and pytest into every Airflow container.
    assert lock_version("jax") and lock_version("pytest"), "the lock no longer holds the extras: revisit this"
    assert "-r /opt/tpuflow/requirements.lock" not in runs, "the lock constrains the Airflow image, never adds"


@pytest.mark.parametrize("name,platform", [("ray-tpu.Dockerfile", "tpu"), ("ray-cpu.Dockerfile", "cpu")])
def test_ray_bases_match_the_lock(name: str, platform: str) -> None:
    py = lock_python().replace(".", "")
    assert base_image(DOCKER / name) == f"rayproject/ray:{lock_version('ray')}-py{py}-{platform}"
    steps = instructions(DOCKER / name)
    runs = " ".join(args for kw, args in steps if kw == "RUN")
    assert "-c /tmp/tpuflow-requirements.lock" in runs, "workload libraries must be constrained by the lock"
    copies = [shlex.split(args) for kw, args in steps if kw == "COPY"]
    assert any(c[-2:] == ["workloads", "/home/ray/workloads"] for c in copies), "the image must carry workloads/"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_in_the_build_context(path: Path) -> None:
    ignored = {
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")
    }
    for keyword, args in instructions(path):
        if keyword != "COPY":
            continue
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        for src in parts[:-1]:
            assert (REPO / src).exists(), f"{path.name}: COPY {src} but the repository has no {src}"
            assert src.split("/")[0] not in ignored, f"{path.name}: COPY {src} is excluded by .dockerignore"
    assert ".venv" in ignored, "the 3 GB .venv must stay out of the build context"


def test_gke_dag_default_workloads_path_is_where_the_images_put_them() -> None:
    gke = REPO / "operators" / "tpuflow" / "pipeline" / "gke.py"
    uris = set(re.findall(r"local://(/[\w/.-]+)", gke.read_text()))
    assert uris <= {"/home/ray/workloads"}, (
        f"the GKE DAG expects workloads at {uris}; the images put them at /home/ray/workloads"
    )


def _pip_installs(path: Path) -> list[list[str]]:
    """The arguments of every `pip install` in the file's RUN steps (each `&&`-joined command apart)."""
    out = []
    for keyword, args in instructions(path):
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;", args):
            words = shlex.split(command)
            for i in range(len(words) - 1):
                if words[i] == "pip" and words[i + 1] == "install":
                    out.append(words[i + 2 :])
    return out


def test_airflow_image_builds_the_wheel_from_operators_and_workloads_and_installs_it_non_editable() -> None:
    path = DOCKER / "airflow.Dockerfile"
    steps = instructions(path)
    copied = {}
    for index, (keyword, args) in enumerate(steps):
        if keyword == "COPY":
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            for src in parts[:-1]:
                dest = parts[-1]
                copied[src] = (index, dest if not dest.endswith("/") else dest + Path(src).name)
    # What setuptools needs to build the wheel: the metadata and both package folders (package-dir).
    for src in ("pyproject.toml", "README.md", "operators", "workloads"):
        assert src in copied, f"the Airflow image must COPY {src} to build the wheel"
        assert copied[src][1] == f"/opt/tpuflow/{src}", f"{src} is copied to {copied[src][1]}, not /opt/tpuflow/{src}"
    installs = _pip_installs(path)
    assert installs, "the Airflow image installs nothing with pip"
    for words in installs:
        assert not {"-e", "--editable"} & set(words), f"an editable install in the image: pip install {' '.join(words)}"
    project = [w for w in installs if "/opt/tpuflow" in w]
    assert len(project) == 1, f"the project is pip-installed once: {project}"
    assert "-c" in project[0] and "-r" not in project[0], f"the lock constrains the project's install: {project}"
    install_step = next(i for i, (kw, args) in enumerate(steps) if kw == "RUN" and "/opt/tpuflow " in args + " ")
    assert all(copied[src][0] < install_step for src in ("pyproject.toml", "operators", "workloads")), (
        "the sources must be copied before the project is installed"
    )


@pytest.mark.parametrize("name", ["ray-tpu.Dockerfile", "ray-cpu.Dockerfile"])
def test_ray_images_put_workloads_where_the_gke_dag_points_and_on_pythonpath(name: str) -> None:
    from tpuflow.pipeline.gke import IMAGE_WORKLOADS_URI

    steps = instructions(DOCKER / name)
    dests = [shlex.split(args)[-1] for kw, args in steps if kw == "COPY" and shlex.split(args)[-2:-1] == ["workloads"]]
    assert dests == [IMAGE_WORKLOADS_URI.removeprefix("local://")], f"{name} copies workloads/ to {dests}"
    env = dict(args.split("=", 1) for kw, args in steps if kw == "ENV" and "=" in args)
    # Job entrypoints and Serve apps import `addition` / `tpuflow_driver` from the image's copy.
    assert dests[0] in env.get("PYTHONPATH", "").split(":"), f"{name}: PYTHONPATH={env.get('PYTHONPATH')!r}"


def _extra(name: str) -> dict[str, Requirement]:
    """pyproject's optional-dependencies[name], by lower-case package name."""
    reqs = map(
        Requirement, tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]
    )
    return {req.name.lower(): req for req in reqs}


def _installed(path: Path) -> dict[str, Requirement]:
    """Every package a `pip install` in the file names (options, -r/-c files and paths left out)."""
    options_with_value = {"-r", "-c", "--index-url", "--extra-index-url", "-f", "--find-links"}
    out = {}
    for words in _pip_installs(path):
        skip = False
        for word in words:
            if skip or word.startswith("-") or "/" in word:
                skip = word in options_with_value
                continue
            req = Requirement(word)
            out[req.name.lower()] = req
    return out


@pytest.mark.parametrize("name", ["ray-tpu.Dockerfile", "ray-cpu.Dockerfile"])
def test_ray_images_install_the_jax_and_torch_extras(name: str) -> None:
    # Job drivers run on the head (a TorchTrainer driver imports torch), training loops on the workers.
    installed, wanted = _installed(DOCKER / name), _extra("jax") | _extra("torch")
    assert set(wanted) <= set(installed), f"{name} lacks {sorted(set(wanted) - set(installed))} of [jax,torch]"
    for package, req in installed.items():
        pins = [spec.version for spec in req.specifier if spec.operator == "=="]
        if package in wanted and pins:
            assert pins[0] in wanted[package].specifier, f"{name} installs {req}, outside pyproject's {wanted[package]}"


def test_airflow_image_installs_no_ml_extra() -> None:
    heavy = set(_installed(DOCKER / "airflow.Dockerfile")) & (set(_extra("jax")) | set(_extra("torch")))
    assert not heavy, f"the Airflow image names {sorted(heavy)}: the provider never imports them"
