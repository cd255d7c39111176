"""KubeRay's CRDs, shipped with tpuflow: the imitation control plane's schemas and field validation by default.

``ray.io_<plural>.yaml.gz`` from KubeRay's ``ray-operator/config/crd/bases`` at ``KUBERAY_VERSION`` (the operator
version controlplane/kuberay/go.mod pins; controlplane/kuberay/ship-crds.sh refreshes them). Apache-2.0: NOTICE
and LICENSE beside them.
"""

from __future__ import annotations

from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent
KUBERAY_VERSION = (DIRECTORY / "VERSION").read_text().strip()
