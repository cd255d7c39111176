"""rayclusters_ready_s / controlplane_start_s (issue 46): the real control plane against the imitation it
replaces, same run, same machine.

- ``controlplane_start_s``: ``RehearsalStack.start()`` (etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler, the KubeRay operator with its CRDs, the TPU webhook and the node agent; binaries already built)
  against ``StandinStack.start()`` (the Python Kubernetes API and the simulated KubeRay).
- ``rayclusters_ready_s``: one RayCluster of the project's manifests (a v6e 2x2: a CPU head and one TPU host;
  authentication off on both sides) from its create to KubeRay's ``status.state: ready``, on a node pool made
  beforehand: the real operator, real scheduler and the node agent's pods against the simulated operator and
  its local Ray cluster. Both sides start real Ray processes; the real side's time includes the probes the real
  operator puts on its pods (readiness every 5 s after 10 s), which the imitation does not model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.core import Context, Result, measure, ratio

NAME = "bench-ready"


def _manifest() -> dict[str, Any]:
    from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest
    from tpuflow.tpu import TpuSlice

    template = RayClusterTemplate(
        TpuSlice.from_spec("TPU-V6E", "2x2"), image="rayproject/ray:2.60.0-py311", auth_mode="disabled"
    )
    return raycluster_manifest(template.validated(), name=NAME)


def _pool(stack: Any) -> None:
    stack.gke.create_node_pool(
        stack.project,
        stack.zone,
        stack.cluster,
        {"nodePool": {"name": "bench", "initialNodeCount": 1, "config": {"machineType": "ct6e-standard-4t"}}},
    )  # fmt: skip


def _ready_s(create: Any, state: Any, timeout: float = 600.0) -> float:
    started = time.perf_counter()
    create()
    while time.perf_counter() - started < timeout:
        if state() == "ready":
            return time.perf_counter() - started
        time.sleep(0.2)
    raise TimeoutError(f"RayCluster {NAME} not ready after {timeout:.0f}s")


def _real(work: Path) -> tuple[float, float]:
    from tpuflow_rehearsal.controlplane import binaries
    from tpuflow_rehearsal.rehearsal import RehearsalStack

    binaries.ensure()
    stack = RehearsalStack(work / "real", operation_seconds=0)
    started = time.perf_counter()
    with stack:
        start_s = time.perf_counter() - started
        api = stack.api()
        _pool(stack)
        while len(api.items("/api/v1/nodes")) < 2 or not api.items("/api/v1/namespaces/default/serviceaccounts"):
            time.sleep(0.2)
        path = "/apis/ray.io/v1/namespaces/default/rayclusters"
        ready_s = _ready_s(
            lambda: api.request("POST", path, _manifest()),
            lambda: api.request("GET", f"{path}/{NAME}").get("status", {}).get("state"),
        )
    return start_s, ready_s


def _imitation(work: Path) -> tuple[float, float]:
    from tpuflow_rehearsal.ray_launcher import LocalRayLauncher
    from tpuflow_rehearsal.standins.kubernetes_api import RAYCLUSTERS
    from tpuflow_rehearsal.standins.stack import StandinStack

    stack = StandinStack(
        work / "imitation", operation_seconds=0, launcher=LocalRayLauncher(work / "imitation" / "ray", timeout=600)
    )
    started = time.perf_counter()
    with stack:
        start_s = time.perf_counter() - started
        _pool(stack)
        store = stack.kube.store
        ready_s = _ready_s(
            lambda: store.create(RAYCLUSTERS, "default", _manifest()),
            lambda: ((store.find(RAYCLUSTERS, "default", NAME) or {}).get("status") or {}).get("state"),
        )
    return start_s, ready_s


@measure("rayclusters_ready_s", quick=False, produces=("controlplane_start_s",))
def rayclusters_ready(ctx: Context) -> list[Result]:
    real_start, real_ready = _real(ctx.work / "controlplane")
    fake_start, fake_ready = _imitation(ctx.work / "controlplane")
    ctx.log(f"control plane start {real_start:.1f}s (imitation {fake_start:.1f}s); ready {real_ready:.1f}s "
            f"(imitation {fake_ready:.1f}s)")  # fmt: skip
    return [
        Result(
            "rayclusters_ready_s", real_ready, "s", fake_ready, ratio(real_ready, fake_ready), "reported", None,
            variant="v6e 2x2 (head + 1 TPU host)",
            baseline_is="the same manifest on the imitation (Python Kubernetes API, simulated KubeRay, LocalRayCluster)",
            notes="create -> status.state ready; the real side includes kube-scheduler, the webhook, the node "
                  "agent's pod start and the real operator's readiness probes (10 s initial delay, 5 s period)",
        ),
        Result(
            "controlplane_start_s", real_start, "s", fake_start, ratio(real_start, fake_start), "reported", None,
            baseline_is="StandinStack.start(): the imitation's API server and simulated operator",
            notes="etcd, kube-apiserver ready, RBAC and KubeRay's CRDs established, controller-manager, scheduler, "
                  "the KubeRay operator ready, the webhook registered, the node agent's first nodes",
        ),
    ]  # fmt: skip
