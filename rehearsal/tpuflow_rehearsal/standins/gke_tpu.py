"""What the stand-ins know about GKE's TPU machines, written down from GKE's documentation.

Independent of tpuflow's own slice catalog (tpuflow.tpu) on purpose: the stand-ins play GKE and its
KubeRay TPU webhook, so a mistake in the operators' catalog must show up as a rejection here, not be
shared by both sides. Sources: GKE's "Plan TPUs in GKE" / Ironwood pages and the KubeRay TPU samples
(../shared/reference/FACTS.md summarises them):

- machine families and the chips per VM they come in (the ``-<N>t`` suffix);
- the node labels GKE sets on TPU nodes (accelerator, topology) and the ``google.com/tpu`` resource;
- the topologies GKE offers per accelerator; a multi-host slice is built from 4-chip VMs;
- Ironwood (tpu7x) multi-host pools are placed with a workload policy instead of a tpuTopology.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
GKE_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
MULTI_HOST_CHIPS_PER_VM = 4  # every multi-host slice GKE builds uses 4-chip VMs

_MACHINE_RE = re.compile(r"^(?P<family>.+)-(?P<chips>\d+)t$")


def chips_in(topology: str) -> int:
    """Chips of a topology ("4x4" = 16, "2x2x2" = 8); ValueError for anything that is not NxM[xK]."""
    dims = topology.lower().split("x")
    if len(dims) not in (2, 3) or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise ValueError(f"not a TPU topology: {topology!r}")
    return math.prod(int(d) for d in dims)


def _cubes(limit: tuple[int, int, int]) -> frozenset[str]:
    """3D shapes beyond the small ones: every side a multiple of 4, sides non-decreasing, within `limit`."""
    out = set()
    for x in range(4, limit[0] + 1, 4):
        for y in range(x, limit[1] + 1, 4):
            for z in range(y, limit[2] + 1, 4):
                out.add(f"{x}x{y}x{z}")
    return frozenset(out)


_PLANE = frozenset({"1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"})
_SMALL_CUBES = frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4"})


@dataclass(frozen=True)
class TpuMachineFamily:
    """One TPU machine family as GKE offers it."""

    family: str  # machine type without "-<N>t"
    accelerator: str  # the cloud.google.com/gke-tpu-accelerator node label
    chips_per_vm: tuple[int, ...]
    dims: int
    topologies: frozenset[str]
    workload_policy: bool = False  # multi-host pools: placementPolicy.policyName, not tpuTopology
    cores_per_chip: int = 1  # TPU devices a chip presents (Ironwood: 2 chiplets)

    @property
    def generation(self) -> str:
        return self.accelerator  # how GKE's error messages name the TPU

    @property
    def machine_types(self) -> tuple[str, ...]:
        return tuple(f"{self.family}-{n}t" for n in self.chips_per_vm)

    def single_vm_topology(self, chips: int) -> str:
        """The topology label GKE gives a single-host node of `chips` chips (the smallest such shape)."""
        shapes = sorted(
            (t for t in self.topologies if chips_in(t) == chips), key=lambda t: [int(d) for d in t.split("x")]
        )
        return shapes[0] if shapes else "x".join(["1"] * self.dims)


FAMILIES: tuple[TpuMachineFamily, ...] = (
    TpuMachineFamily("ct4p-hightpu", "tpu-v4-podslice", (4,), 3, _SMALL_CUBES | _cubes((16, 16, 16))),
    TpuMachineFamily("ct5lp-hightpu", "tpu-v5-lite-podslice", (1, 4, 8), 2, _PLANE),
    TpuMachineFamily("ct5p-hightpu", "tpu-v5p-slice", (4,), 3, _SMALL_CUBES | _cubes((16, 16, 24))),
    TpuMachineFamily("ct6e-standard", "tpu-v6e-slice", (1, 4, 8), 2, _PLANE),
    TpuMachineFamily(
        "tpu7x-standard",
        "tpu7x",
        (4,),
        3,
        _SMALL_CUBES | {"4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"},
        workload_policy=True,
        cores_per_chip=2,
    ),
)


def tpu_machine_family(machine_type: str) -> tuple[TpuMachineFamily, int] | None:
    """(family, chips per VM) of a TPU machine type; None for other machine types.

    Raises ValueError naming the family's machine types for a TPU family with an unknown chip count.
    """
    m = _MACHINE_RE.match(machine_type or "")
    if not m:
        return None
    for fam in FAMILIES:
        if fam.family == m.group("family"):
            chips = int(m.group("chips"))
            if chips not in fam.chips_per_vm:
                raise ValueError(
                    f'Machine type "{machine_type}" does not exist; {fam.accelerator} machine types are '
                    f"{', '.join(fam.machine_types)}."
                )
            return fam, chips
    return None


def family_of(accelerator: str) -> TpuMachineFamily | None:
    return next((fam for fam in FAMILIES if fam.accelerator == accelerator), None)


@dataclass(frozen=True)
class SliceShape:
    """The TPU slice a KubeRay worker group asks for, read from the group as GKE schedules it."""

    accelerator: str  # the cloud.google.com/gke-tpu-accelerator the pods select
    topology: str
    chips_per_host: int  # google.com/tpu per pod
    hosts: int  # numOfHosts: pods (GKE nodes) per slice
    slices: int = 1  # replicas

    @property
    def node_selector(self) -> dict[str, str]:
        return {GKE_ACCELERATOR_LABEL: self.accelerator, GKE_TOPOLOGY_LABEL: self.topology}

    @property
    def machine_type(self) -> str | None:
        fam = family_of(self.accelerator)
        return f"{fam.family}-{self.chips_per_host}t" if fam else None
