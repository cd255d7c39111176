"""Where tpuflow keeps its local state: one home for TPUFLOW_HOME and the output root.

Both read the process environment, or ``env`` when given (the environment another process, e.g. a
local Airflow service, runs with).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def tpuflow_home(env: Mapping[str, str] | None = None) -> Path:
    """Local state (clusters, slice leases, local outputs): $TPUFLOW_HOME, else ~/.tpuflow."""
    environ = os.environ if env is None else env
    return Path(environ.get("TPUFLOW_HOME") or Path.home() / ".tpuflow").absolute()


def output_root(env: Mapping[str, str] | None = None) -> str:
    """Where runs write their outputs: $TPUFLOW_OUTPUT_ROOT (a local folder or gs://BUCKET/PREFIX),
    else the outputs folder under tpuflow_home()."""
    environ = os.environ if env is None else env
    root = environ.get("TPUFLOW_OUTPUT_ROOT", "").strip()
    if root.startswith("gs://"):
        return root.rstrip("/")
    return str(Path(root).absolute() if root else tpuflow_home(environ) / "outputs")


def gke_lease_root(output_root: str) -> str:
    """The GKE pipeline's lease root: beside its runs' outputs (gs:// on GKE), so every DAG sharing the output root
    (the Variable tpuflow_gke_output_root), every worker and `tpuflow reap` share its slice leases."""
    return f"{output_root.rstrip('/')}/_tpuflow/slice-leases"
