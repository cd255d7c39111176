"""Static facts about Cloud TPU generations, as GKE and Ray 2.60 name them.

Pure data, no heavy imports: DAG files and the CLI read it at parse time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace


def _larger_3d(max_x: int, max_y: int, max_z: int, *, ascending: bool) -> frozenset[str]:
    """Topologies whose every dimension is a multiple of 4 (one 4-chip host per cube face)."""
    shapes = set()
    for x, y, z in itertools.product(range(4, max_x + 1, 4), range(4, max_y + 1, 4), range(4, max_z + 1, 4)):
        if ascending and not (x <= y <= z):
            continue
        shapes.add(f"{x}x{y}x{z}")
    return frozenset(shapes)


_SMALL_3D = frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4"})
_TWO_D = frozenset({"1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"})
_V7X = frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"})


@dataclass(frozen=True)
class Generation:
    """One TPU generation and every name the ecosystem gives it."""

    name: str  # our canonical name: v4 | v5e | v5p | v6e | tpu7x
    gke_accelerator: str  # node label cloud.google.com/gke-tpu-accelerator
    ray_accelerator_type: str  # Ray's accelerator_type (ScalingConfig, resources)
    ray_version: str  # Ray's accelerator_version / pod-type prefix (v5litepod, v7x, ...)
    machine_family: str  # machine type without the "-<N>t" suffix
    machine_chip_options: tuple[int, ...]  # N in "-<N>t"
    dims: int  # 2 for 2D torus generations, 3 for 3D
    cores_per_chip: int  # TensorCores per chip: Ray's pod type counts cores
    logical_devices_per_chip: int  # XLA devices per chip (tpu7x: 2 chiplets)
    gke_topologies: frozenset[str]
    ray_topologies: frozenset[str]  # ray/_private/accelerators/tpu.py VALID_TPU_TOPOLOGY
    single_vm_max_chips: int  # largest shape that fits on one VM (v5e/v6e: 8)
    multi_host_uses_workload_policy: bool = False

    def machine_type(self, chips_per_host: int) -> str:
        return f"{self.machine_family}-{chips_per_host}t"

    @property
    def machine_types(self) -> tuple[str, ...]:
        return tuple(self.machine_type(n) for n in self.machine_chip_options)

    @property
    def known_topologies(self) -> frozenset[str]:
        return self.gke_topologies | self.ray_topologies


# v5e and v6e are 2D tori of 1-, 4- or 8-chip VMs; v4 and v5p 3D tori of 4-chip VMs. The second of each
# pair differs from the first only in its names (and, for v5p, its largest shapes).
_V5E = Generation(
    name="v5e",
    gke_accelerator="tpu-v5-lite-podslice",
    ray_accelerator_type="TPU-V5LITEPOD",
    ray_version="v5litepod",
    machine_family="ct5lp-hightpu",
    machine_chip_options=(1, 4, 8),
    dims=2,
    cores_per_chip=1,
    logical_devices_per_chip=1,
    gke_topologies=_TWO_D,
    ray_topologies=_TWO_D | {"2x8"},
    single_vm_max_chips=8,
)
_V4 = Generation(
    name="v4",
    gke_accelerator="tpu-v4-podslice",
    ray_accelerator_type="TPU-V4",
    ray_version="v4",
    machine_family="ct4p-hightpu",
    machine_chip_options=(4,),
    dims=3,
    cores_per_chip=2,
    logical_devices_per_chip=1,
    gke_topologies=_SMALL_3D | _larger_3d(16, 16, 16, ascending=True),
    ray_topologies=_SMALL_3D | _larger_3d(12, 12, 16, ascending=False),
    single_vm_max_chips=4,
)

GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        _V4,
        _V5E,
        replace(
            _V4,
            name="v5p",
            gke_accelerator="tpu-v5p-slice",
            ray_accelerator_type="TPU-V5P",
            ray_version="v5p",
            machine_family="ct5p-hightpu",
            gke_topologies=_SMALL_3D | _larger_3d(16, 16, 24, ascending=True),
            ray_topologies=_SMALL_3D | _larger_3d(16, 16, 24, ascending=False),
        ),
        replace(
            _V5E,
            name="v6e",
            gke_accelerator="tpu-v6e-slice",
            ray_accelerator_type="TPU-V6E",
            ray_version="v6e",
            machine_family="ct6e-standard",
        ),
        replace(
            _V4,  # 3-D, 4-chip VMs, 2 cores a chip; each core its own device
            name="tpu7x",
            gke_accelerator="tpu7x",
            ray_accelerator_type="TPU-V7X",
            ray_version="v7x",
            machine_family="tpu7x-standard",
            logical_devices_per_chip=2,
            gke_topologies=_V7X,
            ray_topologies=_V7X,
            multi_host_uses_workload_policy=True,
        ),
    )
}

# Names users type that look right but are not what Ray or GKE accept.
MISLEADING_NAMES: dict[str, str] = {
    "tpu-v5e": "TPU-V5LITEPOD",
    "tpu-v5litepod-slice": "tpu-v5-lite-podslice",
    "tpu-v7x": "TPU-V7X",
    "v7": "tpu7x",
    "tpu-v6": "TPU-V6E",
}


def _aliases() -> dict[str, Generation]:
    table: dict[str, Generation] = {}
    for gen in GENERATIONS.values():
        for alias in (gen.name, gen.gke_accelerator, gen.ray_accelerator_type, gen.ray_version):
            table[alias.lower()] = gen
    return table


ALIASES = _aliases()


def accepted_accelerator_names() -> list[str]:
    return sorted({g.ray_accelerator_type for g in GENERATIONS.values()}) + sorted(
        {g.gke_accelerator for g in GENERATIONS.values()} | set(GENERATIONS)
    )
