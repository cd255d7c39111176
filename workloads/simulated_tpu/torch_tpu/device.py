"""``torch.tpu``: the runtime module torch looks up for the device type ``tpu`` (torch.get_device_module).

torch.accelerator asks it whether the accelerator is available, e.g. in every optimizer step; on a
simulated host there is no chip, so no: the training runs on the CPU."""

from __future__ import annotations


def is_available() -> bool:
    return False


def is_initialized() -> bool:
    return False


def device_count() -> int:
    return 0
