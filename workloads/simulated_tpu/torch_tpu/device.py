"""``torch.tpu``: the runtime module torch looks up for the device type ``tpu`` (torch.get_device_module).

DeviceMesh, DTensor, FSDP2 and torch.accelerator ask it about the chips: a host has as many as
processes share it (LOCAL_WORLD_SIZE, as Ray Train and the seed set it), each process drives one. Their memory is the host's, their work synchronous, hence streams and
events as torch.cpu has them.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.cpu import Event, Stream, StreamContext, current_stream, stream

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_device",
    "current_stream",
    "device_count",
    "get_rng_state",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "set_device",
    "set_rng_state",
    "stream",
    "synchronize",
]

_current = 0


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return max(1, int(local)) if local.isdigit() else 1


def current_device() -> int:
    return _current


def set_device(device: Any) -> None:
    global _current
    index = device if isinstance(device, int) else torch.device(device).index
    _current = index or 0


def synchronize(device: Any = None) -> None:
    return None


def manual_seed(seed: int) -> None:
    return None  # random tensors on tpu are drawn on the host, from torch's CPU generator


def manual_seed_all(seed: int) -> None:
    return None


def get_rng_state(device: Any = None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    torch.set_rng_state(state)
