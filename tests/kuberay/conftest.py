"""Fixtures for the KubeRay tests: the Kubernetes stand-in with a simulated KubeRay operator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Any]:
    """Kubernetes API stand-in + simulated KubeRay with a fake (Ray-less) launcher; no node pools yet."""
    from tpuflow_rehearsal.standins.kuberay_controller import FakeRayLauncher, KubeRayStandin, StaticNodePools

    kube = KubeRayStandin(tmp_path / "kube", launcher=FakeRayLauncher(), node_pools=StaticNodePools(), interval=0.05)
    kube.controller.serve_poll_interval = 0.05
    with kube:
        yield kube
    assert kube.controller.errors == [], "the simulated KubeRay operator raised while reconciling"
