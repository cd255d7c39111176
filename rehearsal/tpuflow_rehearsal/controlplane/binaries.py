"""Where the real control plane's binaries are, and building them when they are not there.

``controlplane/build.sh`` (``make controlplane``) builds them from the Go modules pinned in ``controlplane/``
into ``.controlplane/bin`` (and the KubeRay CRDs of the operator's own version into ``.controlplane/crds``),
through a cache outside the repository that a later clone on the same machine reuses. $TPUFLOW_CONTROLPLANE_DIR
names another folder with the same ``bin/`` and ``crds/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
KUBE = "tpuflow-kube"  # etcd, kube-apiserver, kube-controller-manager, kube-scheduler (one multi-call binary)
KUBERAY = "kuberay-operator"


class ControlPlaneUnavailable(RuntimeError):
    """The binaries are not built and cannot be (no Go, no build script, a failed build): one line saying why."""


@dataclass(frozen=True)
class Binaries:
    root: Path

    @property
    def kube(self) -> Path:
        return self.root / "bin" / KUBE

    @property
    def kuberay(self) -> Path:
        return self.root / "bin" / KUBERAY

    @property
    def crds(self) -> Path:
        return self.root / "crds"

    @property
    def operator_role(self) -> Path:
        """KubeRay's own ClusterRole (config/rbac/role.yaml of the operator's module)."""
        return self.root / "rbac" / "kuberay-operator-role.yaml"

    def present(self) -> bool:
        return (
            os.access(self.kube, os.X_OK)
            and os.access(self.kuberay, os.X_OK)
            and (self.crds / "ray.io_rayclusters.yaml").is_file()
            and self.operator_role.is_file()
        )


def default_root() -> Path:
    return Path(os.environ.get("TPUFLOW_CONTROLPLANE_DIR") or REPO / ".controlplane")


def find() -> Binaries | None:
    """The built binaries, or None."""
    binaries = Binaries(default_root())
    return binaries if binaries.present() else None


def ensure(*, build: bool = True) -> Binaries:
    """The built binaries, building them first (minutes when cold, seconds from the cache) if ``build``."""
    binaries = Binaries(default_root())
    if binaries.present():
        return binaries
    script = REPO / "controlplane" / "build.sh"
    if not build:
        raise ControlPlaneUnavailable(f"the control plane is not built in {binaries.root}: run `make controlplane`")
    if not script.is_file():
        raise ControlPlaneUnavailable(
            f"the control plane is not built in {binaries.root} and {script} is not there (an installed tpuflow "
            "without its repository): set TPUFLOW_CONTROLPLANE_DIR to a folder with bin/ and crds/"
        )
    if shutil.which("go") is None:
        raise ControlPlaneUnavailable("the real control plane is built from Go modules: install Go 1.26, then retry")
    done = subprocess.run(
        ["bash", str(script), str(binaries.root / "bin")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not binaries.present():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ControlPlaneUnavailable(f"building the control plane failed ({script}): {last}")
    return binaries
