"""``torch_tpu._loader.load()``: what Ray Train calls before ``init_process_group("tpu_dist")``.

The real loader registers TorchTPU's collectives; the stand-in registers ``tpu_dist`` as gloo on
the CPU, so the same backend name initialises a process group on the simulated hosts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

BACKEND = "tpu_dist"


def _gloo_group(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def load() -> None:
    """Register the ``tpu_dist`` backend (idempotent; Ray calls this once per worker)."""
    if getattr(dist.Backend, BACKEND.upper(), None) == BACKEND:
        return
    dist.Backend.register_backend(BACKEND, _gloo_group, devices=["cpu"])
