"""``torch_tpu._loader.load()``: what Ray Train calls before ``init_process_group("tpu_dist")``.

The real loader registers TorchTPU's collectives; the stand-in registers ``tpu_dist`` as gloo on
the hosts' CPUs, for tensors on ``cpu`` and on ``tpu`` alike: a collective on a ``tpu`` tensor runs
on the CPU tensor inside it (``torch_tpu._tensor``), so one gloo group serves both."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist

BACKEND = "tpu_dist"


class SliceMismatchError(RuntimeError):
    """A process group that cannot form on this slice: it would wait for ranks that never come."""


def check_world_size(size: int, env: Mapping[str, str]) -> None:
    """Refuse a group larger than the slice's TPU devices (one TORCH_TPU_SLICEBUILDER_ADDRESSES entry each, as GKE's
    webhook gives them): its missing ranks never join, and gloo would wait for them silently until its timeout."""
    addresses = [a for a in env.get("TORCH_TPU_SLICEBUILDER_ADDRESSES", "").split(",") if a]
    if addresses and size > len(addresses):
        hosts = len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) or 1
        raise SliceMismatchError(
            f"tpu_dist: WORLD_SIZE={size} but this slice ({env.get('TPU_ACCELERATOR_TYPE', '?')}, topology "
            f"{env.get('TPU_TOPOLOGY', '?')}) has {len(addresses)} TPU devices on {hosts} host(s): the ranks past "
            f"{len(addresses) - 1} never join; if Ray placed them (Ray 2.60 reads a v6e or v5e 2x4 as one 8-chip "
            f"host), pass chips_per_vm={len(addresses) // hosts} to ray.util.tpu.slice_placement_group"
        )


def _gloo_group(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    check_world_size(size, os.environ)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def load() -> None:
    """Register the ``tpu_dist`` backend (idempotent; Ray calls this once per worker)."""
    if getattr(dist.Backend, BACKEND.upper(), None) == BACKEND:
        return
    dist.Backend.register_backend(BACKEND, _gloo_group, devices=["cpu", "tpu"])
