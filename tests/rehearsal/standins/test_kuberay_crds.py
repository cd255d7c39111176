"""The KubeRay CRDs tpuflow ships (tpuflow_rehearsal.standins.kuberay_crds) are those of the operator version
controlplane/kuberay/go.mod pins, and the imitation control plane uses them unless told otherwise.

Refresh them after changing the pin: bash controlplane/kuberay/ship-crds.sh."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tpuflow.errors import UserInputError
from tpuflow_rehearsal.standins import kuberay_crds
from tpuflow_rehearsal.standins.kubernetes_catalog import CrdSchemas, holds_crds
from tpuflow_rehearsal.standins.stack import CRDS_ENV, StandinStack, default_crds

REPO = Path(__file__).resolve().parents[3]
GO_MOD = REPO / "controlplane" / "kuberay" / "go.mod"
MODULE = "github.com/ray-project/kuberay/ray-operator"
BUILT_CRDS = REPO / ".controlplane" / "crds"  # make controlplane copies them from the module it built
REFRESH = "refresh them: bash controlplane/kuberay/ship-crds.sh"


def shipped() -> dict[str, bytes]:
    """ray.io_<plural>.yaml -> its text, as shipped (gzipped)."""
    files = sorted(kuberay_crds.DIRECTORY.glob("ray.io_*.yaml.gz"))
    return {path.name.removesuffix(".gz"): gzip.decompress(path.read_bytes()) for path in files}


def pinned_version() -> str:
    found = re.search(rf"^\s*{re.escape(MODULE)} (v\S+)", GO_MOD.read_text(), re.MULTILINE)
    assert found, f"{GO_MOD} pins no {MODULE}"
    return found.group(1)


def module_dir() -> Path | None:
    """The pinned module in Go's module cache, without going to the network (None: no Go, or not downloaded)."""
    if shutil.which("go") is None:
        return None
    done = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", MODULE],
        cwd=GO_MOD.parent,
        env={**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=mod"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def test_the_shipped_crds_are_kuberays_four_of_the_pinned_version() -> None:
    assert kuberay_crds.KUBERAY_VERSION == pinned_version(), REFRESH
    assert sorted(shipped()) == [f"ray.io_{p}.yaml" for p in ("rayclusters", "raycronjobs", "rayjobs", "rayservices")]
    notice = (kuberay_crds.DIRECTORY / "NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice and "KubeRay" in notice
    assert "Apache License" in (kuberay_crds.DIRECTORY / "LICENSE").read_text()


def test_the_shipped_crds_are_the_pinned_modules_own() -> None:
    module = module_dir()
    if module is None:
        pytest.skip(
            f"Go or the module {MODULE}@{pinned_version()} is not on this machine (make controlplane fetches it)"
        )
    assert module.name == f"ray-operator@{kuberay_crds.KUBERAY_VERSION}", REFRESH
    theirs = {p.name: p.read_bytes() for p in sorted((module / "config" / "crd" / "bases").glob("ray.io_*.yaml"))}
    assert shipped() == theirs, REFRESH
    assert (kuberay_crds.DIRECTORY / "LICENSE").read_bytes() == (module / "LICENSE").read_bytes()


def test_the_shipped_crds_are_those_the_real_control_plane_installs() -> None:
    if not (BUILT_CRDS / "ray.io_rayclusters.yaml").is_file():
        pytest.skip(f"{BUILT_CRDS} is not built (make controlplane)")
    built = {p.name: p.read_bytes() for p in sorted(BUILT_CRDS.glob("ray.io_*.yaml"))}
    assert shipped() == built, f"{REFRESH} (or make controlplane, if go.mod changed since the last build)"


def test_the_catalog_reads_the_gzipped_crds_as_their_yaml(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    for name, text in shipped().items():
        (plain / name).write_bytes(text)
    assert holds_crds(plain) and holds_crds(kuberay_crds.DIRECTORY) and not holds_crds(tmp_path)
    ours, theirs = CrdSchemas.load(kuberay_crds.DIRECTORY), CrdSchemas.load(plain)
    assert sorted(ours.schemas) == ["rayclusters", "raycronjobs", "rayjobs", "rayservices"]
    assert ours.schemas == theirs.schemas and ours.printer_columns == theirs.printer_columns
    # Ray token authentication: a CRD without it (KubeRay 1.5.0) would prune spec.authOptions silently.
    assert "authOptions" in ours.schema("rayclusters")["properties"]["spec"]["properties"]


def test_the_imitation_uses_the_shipped_crds_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CRDS_ENV, raising=False)
    assert default_crds() == kuberay_crds.DIRECTORY
    stack = StandinStack(tmp_path / "work", fake=True)
    assert stack.crds == kuberay_crds.DIRECTORY and stack.kube.api.store.crds.schema("rayservices") is not None
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "ray.io_rayclusters.yaml").write_bytes(shipped()["ray.io_rayclusters.yaml"])
    monkeypatch.setenv(CRDS_ENV, str(mine))
    assert default_crds() == mine
    assert StandinStack(tmp_path / "work", fake=True, crds=kuberay_crds.DIRECTORY).crds == kuberay_crds.DIRECTORY
    monkeypatch.setenv(CRDS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(UserInputError, match=f"{CRDS_ENV}=.*nowhere.*ray.io_rayclusters.yaml"):
        default_crds()
