"""One immutable TPU slice definition from which every operator derives its shape.

Node pool size, KubeRay numOfHosts, the google.com/tpu request, node selectors, the
Ray Train ScalingConfig and Serve placement all come from a TpuSlice, so they
cannot disagree with each other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from tpuflow.errors import UserInputError
from tpuflow.tpu.generations import (
    ALIASES,
    GENERATIONS,
    MISLEADING_NAMES,
    Generation,
    accepted_accelerator_names,
)

GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
GKE_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
# torch_tpu's slice builder: one port per TPU device of a host, from this one (GKE's TPU webhook)
SLICEBUILDER_PORT = 8471

_TOPOLOGY_RE = re.compile(r"^[1-9]\d*(x[1-9]\d*)+$")
_MACHINE_RE = re.compile(r"^(?P<family>.+)-(?P<chips>\d+)t$")
# GKE's limits (cloud.google.com/kubernetes-engine/quotas): 15,000 nodes per Standard cluster, 1,000 nodes
# per node pool and zone. Every slice host is a node, so no run can hold more hosts than a cluster; a
# single-host request is one node pool of num_slices nodes. Checked before any work (a 20-digit count once
# ran for minutes and took gigabytes before anything looked at it).
MAX_CLUSTER_NODES = 15_000
MAX_NODE_POOL_NODES = 1_000


class SliceSpecError(UserInputError):
    """Bad slice input: names the field, the bad value and what would be valid."""


def resolve_generation(accelerator: str) -> Generation:
    """Accept a Ray accelerator type, a GKE accelerator label or a generation name."""
    if not isinstance(accelerator, str):
        raise SliceSpecError(
            "accelerator", accelerator, "give one name as a string: " + ", ".join(accepted_accelerator_names())
        )
    key = accelerator.strip().lower()
    if key in ALIASES:
        return ALIASES[key]
    if key in MISLEADING_NAMES:
        raise SliceSpecError(
            "accelerator", accelerator, f"Ray and GKE do not know this name; use {MISLEADING_NAMES[key]}"
        )
    raise SliceSpecError("accelerator", accelerator, "use one of " + ", ".join(accepted_accelerator_names()))


def chips_in(topology: str) -> int:
    return math.prod(int(d) for d in topology.split("x"))


def _shapes_with(gen: Generation, chips: int) -> list[str]:
    return sorted((t for t in gen.known_topologies if chips_in(t) == chips), key=_shape_key)


def _shape_key(topology: str) -> tuple[int, ...]:
    return (chips_in(topology), *(int(d) for d in topology.split("x")))


def _check_topology(gen: Generation, topology: object) -> str:
    if isinstance(topology, int) and not isinstance(topology, bool):
        topology = str(topology)  # a chip count: the message below says what to give instead
    if not isinstance(topology, str):
        raise SliceSpecError(
            "topology", topology, f"give the shape as a string, e.g. {'4x4' if gen.dims == 2 else '2x2x2'}"
        )
    topo = topology.strip().lower()
    if topo.isdigit():
        shapes = _shapes_with(gen, int(topo))
        hint = (
            f"e.g. {', '.join(shapes)} ({topo} chips)"
            if shapes
            else f"e.g. {sorted(gen.gke_topologies, key=_shape_key)[:4]}"
        )
        raise SliceSpecError(
            "topology", topology, f"a topology is the slice's shape, not a chip count; give a shape, {hint}"
        )
    if not _TOPOLOGY_RE.match(topo):
        raise SliceSpecError(
            "topology",
            topology,
            f"write the shape as {'AxB' if gen.dims == 2 else 'AxBxC'}, e.g. {'4x4' if gen.dims == 2 else '2x2x2'}",
        )
    if len(topo.split("x")) != gen.dims:
        raise SliceSpecError(
            "topology",
            topology,
            f"{gen.name} slices are {gen.dims}D ({'AxB' if gen.dims == 2 else 'AxBxC'}); "
            f"valid shapes include {', '.join(sorted(gen.gke_topologies, key=_shape_key)[:8])}",
        )
    if topo not in gen.known_topologies:
        raise SliceSpecError(
            "topology",
            topology,
            f"{gen.name} has no such slice; valid shapes: "
            f"{', '.join(sorted(gen.known_topologies, key=_shape_key)[:14])}",
        )
    return topo


def _chips_per_host(gen: Generation, topo: str, machine_type: str | None) -> int:
    chips = chips_in(topo)
    fits_one_vm = chips <= gen.single_vm_max_chips
    default = chips if fits_one_vm and chips in gen.machine_chip_options else 4
    if machine_type is None:
        return default
    if not isinstance(machine_type, str):
        raise SliceSpecError(
            "machine_type", machine_type, f"give a string; {gen.name} machine types are {', '.join(gen.machine_types)}"
        )
    m = _MACHINE_RE.match(machine_type.strip())
    if not m or m.group("family") != gen.machine_family or int(m.group("chips")) not in gen.machine_chip_options:
        raise SliceSpecError(
            "machine_type", machine_type, f"{gen.name} machine types are {', '.join(gen.machine_types)}"
        )
    per_host = int(m.group("chips"))
    valid = {default}
    # v5e/v6e 2x4 exists as one 8-chip VM or as two 4-chip VMs.
    if fits_one_vm and chips == 8 and gen.single_vm_max_chips == 8:
        valid.add(4)
    if per_host not in valid:
        options = ", ".join(gen.machine_type(n) for n in sorted(valid))
        raise SliceSpecError(
            "machine_type", machine_type, f"a {gen.name} {topo} slice ({chips} chips) runs on {options}"
        )
    return per_host


def _check_num_slices(value: int | str) -> int:
    """A whole number 1..MAX_CLUSTER_NODES, looked at as text first: a huge one is never converted."""
    fix = f"give a whole number of slices, 1 or more and at most {MAX_CLUSTER_NODES:,} (GKE's nodes per cluster)"
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
    if not re.fullmatch(r"[0-9]{1,9}", text) or not 1 <= int(text) <= MAX_CLUSTER_NODES:
        raise SliceSpecError("num_slices", value, fix)
    return int(text)


@dataclass(frozen=True)
class TpuSlice:
    generation: Generation
    topology: str
    chips_per_host: int
    num_slices: int = 1
    # built from literals and checked on construction: never a template (tpuflow.templating.is_static)
    static_value: ClassVar[bool] = True

    @classmethod
    def from_spec(
        cls,
        accelerator: str,
        topology: str,
        machine_type: str | None = None,
        num_slices: int | str = 1,
    ) -> TpuSlice:
        gen = resolve_generation(accelerator)
        topo = _check_topology(gen, topology)
        n = _check_num_slices(num_slices)
        per_host = _chips_per_host(gen, topo, machine_type)
        hosts = chips_in(topo) // per_host
        if n * hosts > MAX_CLUSTER_NODES:
            raise SliceSpecError(
                "num_slices",
                num_slices,
                f"give at most {MAX_CLUSTER_NODES // hosts:,} slices of {hosts} host(s) ({gen.name} {topo}): "
                f"GKE allows {MAX_CLUSTER_NODES:,} nodes per cluster",
            )
        return cls(gen, topo, per_host, n)

    # --- shape ---------------------------------------------------------------
    @property
    def chips(self) -> int:
        """Chips in one slice."""
        return chips_in(self.topology)

    @property
    def num_hosts(self) -> int:
        """TPU VMs (GKE nodes, KubeRay numOfHosts) in one slice."""
        return self.chips // self.chips_per_host

    @property
    def total_hosts(self) -> int:
        return self.num_hosts * self.num_slices

    @property
    def multi_host(self) -> bool:
        return self.num_hosts > 1

    @property
    def machine_type(self) -> str:
        return self.generation.machine_type(self.chips_per_host)

    @property
    def ray_pod_type(self) -> str:
        """What Ray calls the slice (TPU_ACCELERATOR_TYPE, ray.io/tpu-pod-type), e.g. v6e-16."""
        return f"{self.generation.ray_version}-{self.chips * self.generation.cores_per_chip}"

    @property
    def logical_devices_per_host(self) -> int:
        """Ray's TPU resource per host: chips, or chiplets on tpu7x."""
        return self.chips_per_host * self.generation.logical_devices_per_chip

    @property
    def gke_supported(self) -> bool:
        return self.topology in self.generation.gke_topologies

    @property
    def ray_supported(self) -> bool:
        return self.topology in self.generation.ray_topologies

    # --- what the platform layers need ----------------------------------------
    @property
    def node_selector(self) -> dict[str, str]:
        return {GKE_ACCELERATOR_LABEL: self.generation.gke_accelerator, GKE_TOPOLOGY_LABEL: self.topology}

    @property
    def tpu_resource_request(self) -> dict[str, str]:
        """The container resource request/limit for one TPU host pod."""
        return {TPU_RESOURCE: str(self.chips_per_host)}

    @property
    def ray_env(self) -> dict[str, str]:
        """Environment every Ray process of the cluster needs (head, workers, drivers)."""
        per_chip = self.generation.logical_devices_per_chip
        return {"RAY_TPU_RESOURCE_PER_CHIP": str(per_chip)} if per_chip > 1 else {}

    @property
    def ray_worker_resources(self) -> dict[str, int]:
        """Resources to declare on a Ray worker node for one host (rayStartParams / ray start)."""
        return {"TPU": self.logical_devices_per_host}

    def scaling_config(self) -> dict[str, Any]:
        """Keyword arguments for ray.train.ScalingConfig: one worker per TPU host."""
        cfg: dict[str, Any] = {
            "use_tpu": True,
            "topology": self.topology,
            "accelerator_type": self.generation.ray_accelerator_type,
            "num_workers": self.total_hosts,
        }
        if self.chips_per_host != self.ray_default_chips_per_host or self.generation.logical_devices_per_chip > 1:
            cfg["resources_per_worker"] = {"TPU": self.logical_devices_per_host}
        return cfg

    @property
    def ray_default_chips_per_host(self) -> int:
        """The chips per host Ray 2.60 assumes for this shape unless told (ray.util.tpu's get_chips_per_host)."""
        return 4 if self.chips > self.generation.single_vm_max_chips else self.chips

    def ray_caveats(self) -> list[str]:
        """What user code must tell Ray about this slice because Ray cannot tell from its shape (same on GKE)."""
        if self.chips_per_host == self.ray_default_chips_per_host:
            return []
        return [
            f"Ray 2.60 reads a {self.generation.name} {self.topology} as {self.ray_default_chips_per_host}-chip "
            f"hosts but this slice has {self.num_hosts} hosts of {self.chips_per_host} chips ({self.machine_type}): "
            f"pass chips_per_vm={self.chips_per_host} to ray.util.tpu.slice_placement_group and "
            f"resources_per_worker={{'TPU': {self.logical_devices_per_host}}} to a per-host ScalingConfig "
            "(tpuflow.tpu.TpuSlice.slice_placement_group_kwargs() / scaling_config() do)"
        ]

    def torch_scaling_config(self) -> dict[str, Any]:
        """TorchTrainer on TPU chips (TorchTPU, backend tpu_dist): one worker per TPU device, not per host."""
        return {
            "use_tpu": True,
            "topology": self.topology,
            "accelerator_type": self.generation.ray_accelerator_type,
            "num_workers": self.logical_devices_per_host * self.total_hosts,
            "resources_per_worker": {"TPU": 1},
        }

    def slice_placement_group_kwargs(self) -> dict[str, Any]:
        """Arguments for ray.util.tpu.slice_placement_group reserving exactly this slice."""
        kwargs: dict[str, Any] = {
            "topology": self.topology,
            "accelerator_version": self.generation.ray_version,
            "num_slices": self.num_slices,
            "chips_per_vm": self.chips_per_host,
        }
        if self.generation.logical_devices_per_chip > 1:
            kwargs["tpu_resource_per_chip"] = self.generation.logical_devices_per_chip
        return kwargs

    def serve_accelerator_config(self) -> dict[str, Any]:
        """Ray Serve LLM placement: a multi-host model must name its topology or it hangs in DEPLOYING."""
        return {
            "accelerator_type": self.generation.ray_accelerator_type,
            "accelerator_config": {"kind": "tpu", "topology": self.topology},
        }

    def simulated_host_env(self, slice_name: str, worker_id: int, hostnames: Sequence[str]) -> dict[str, str]:
        """What GKE's TPU webhook injects into host ``worker_id`` of a slice whose hosts are ``hostnames``.

        Ray derives the slice labels from TPU_NAME / TPU_WORKER_ID / TPU_ACCELERATOR_TYPE / TPU_TOPOLOGY;
        torch_tpu and user code read TPU_WORKER_HOSTNAMES, TORCH_TPU_TOPOLOGY (the shape as x,y,z, plus the
        cores of a multi-core chip) and TORCH_TPU_SLICEBUILDER_ADDRESSES (one port per TPU device, from 8471).
        """
        if len(hostnames) != self.num_hosts:
            raise ValueError(f"{len(hostnames)} hostnames for a slice of {self.num_hosts} hosts")
        dims = self.topology.split("x")
        cores = self.generation.logical_devices_per_chip
        topology = [*dims, *["1"] * (3 - len(dims))] + ([str(cores)] if cores > 1 else [])
        devices = self.logical_devices_per_host
        return {
            "TPU_NAME": slice_name,
            "TPU_WORKER_ID": str(worker_id),
            "TPU_ACCELERATOR_TYPE": self.ray_pod_type,
            "TPU_TOPOLOGY": self.topology,
            "TPU_WORKER_HOSTNAMES": ",".join(hostnames),
            "TORCH_TPU_TOPOLOGY": ",".join(topology),
            "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(
                f"{host}:{SLICEBUILDER_PORT + d}" for host in hostnames for d in range(devices)
            ),
            **self.ray_env,
        }

    def require(self, *, gke: bool = False, ray: bool = False) -> TpuSlice:
        """Reject shapes the target platform does not accept, before anything is provisioned."""
        gen = self.generation
        if gke and not self.gke_supported:
            raise SliceSpecError(
                "topology",
                self.topology,
                f"GKE has no {gen.name} node pool of this shape; use one of "
                f"{', '.join(sorted(gen.gke_topologies, key=_shape_key)[:12])}",
            )
        if gke and not self.multi_host and self.total_hosts > MAX_NODE_POOL_NODES:
            raise SliceSpecError(
                "num_slices",
                self.num_slices,
                f"give at most {MAX_NODE_POOL_NODES:,} single-host slices: they share one node pool, and GKE "
                f"allows {MAX_NODE_POOL_NODES:,} nodes per node pool and zone",
            )
        if ray and not self.ray_supported:
            raise SliceSpecError(
                "topology",
                self.topology,
                f"Ray 2.60 does not accept this {gen.name} topology; use one of "
                f"{', '.join(sorted(gen.ray_topologies, key=_shape_key)[:12])}",
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation.name,
            "gke_accelerator": self.generation.gke_accelerator,
            "ray_accelerator_type": self.generation.ray_accelerator_type,
            "topology": self.topology,
            "machine_type": self.machine_type,
            "chips": self.chips,
            "chips_per_host": self.chips_per_host,
            "num_hosts": self.num_hosts,
            "num_slices": self.num_slices,
            "total_hosts": self.total_hosts,
            "multi_host": self.multi_host,
            "ray_pod_type": self.ray_pod_type,
            "logical_devices_per_chip": self.generation.logical_devices_per_chip,
            "logical_devices_per_host": self.logical_devices_per_host,
            "node_selector": self.node_selector,
            "tpu_resource_request": self.tpu_resource_request,
            "scaling_config": self.scaling_config(),
            "ray_env": self.ray_env,
            "gke_supported": self.gke_supported,
            "ray_supported": self.ray_supported,
        }

    def summary(self) -> str:
        kind = "multi-host" if self.multi_host else "single-host"
        slices = f" x {self.num_slices} slices" if self.num_slices > 1 else ""
        return (
            f"{self.generation.name} {self.topology} ({self.ray_pod_type}){slices}: {self.chips} chips, {kind}, "
            f"{self.num_hosts} x {self.machine_type} per slice, google.com/tpu={self.chips_per_host}, "
            f"Ray {self.generation.ray_accelerator_type}; GKE {'ok' if self.gke_supported else 'NO'}, "
            f"Ray 2.60 {'ok' if self.ray_supported else 'NO'}"
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TpuSlice:
        return cls.from_spec(data["generation"], data["topology"], data.get("machine_type"), data.get("num_slices", 1))


def generation_names() -> list[str]:
    return list(GENERATIONS)
