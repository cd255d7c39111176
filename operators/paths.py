"""Where tpuflow keeps its local state: one home for TPUFLOW_HOME and the output root."""

from __future__ import annotations

import os
from pathlib import Path


def tpuflow_home() -> Path:
    """Local state (clusters, slice leases, local outputs): $TPUFLOW_HOME, else ~/.tpuflow."""
    return Path(os.environ.get("TPUFLOW_HOME") or Path.home() / ".tpuflow").absolute()


def output_root() -> str:
    """Where runs write their outputs: $TPUFLOW_OUTPUT_ROOT (a local folder or gs://BUCKET/PREFIX),
    else the outputs folder under tpuflow_home()."""
    root = os.environ.get("TPUFLOW_OUTPUT_ROOT", "").strip()
    if root.startswith("gs://"):
        return root.rstrip("/")
    return str(Path(root).absolute() if root else tpuflow_home() / "outputs")
