"""The Kubernetes stand-in with simulated KubeRay (a fake Ray launcher) over one TPU slice's node pool."""

from __future__ import annotations

from pathlib import Path

from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, KubeRayStandin, StaticNodePools


def one_slice_kuberay(state_dir: Path, accelerator: str = "v6e", topology: str = "2x2") -> KubeRayStandin:
    """Not started: use it as a context manager (`with one_slice_kuberay(tmp_path / "kube") as kube:`)."""
    tpu = TpuSlice.from_spec(accelerator, topology)
    return KubeRayStandin(
        state_dir,
        launcher=FakeRayLauncher(),
        node_pools=StaticNodePools([(dict(tpu.node_selector), 1)]),
        interval=0.1,
    )
