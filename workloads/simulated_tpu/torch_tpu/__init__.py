"""tpuflow's CPU stand-in for ``torch_tpu`` (TorchTPU), for the simulated TPU slice only.

tpuflow's local cluster puts ``workloads/simulated_tpu`` on the path of every process it starts
(head and simulated hosts), and nowhere else: a machine with the real ``torch_tpu`` never sees
this package. Importing it refuses to run where a real TorchTPU is installed further down the path.

It provides what Ray Train's TPU path (``ScalingConfig(use_tpu=True)``, Ray's
``TPUTorchDeviceManager``) needs of ``torch_tpu`` so that the user's TorchTrainer runs unchanged
on hosts without chips:

- ``import torch_tpu`` succeeds, so ``TPUTorchDeviceManager.is_available()`` is true;
- the torch device type ``"tpu"`` exists (PyTorch's privateuse1 backend renamed to ``tpu``, as
  TorchTPU does), so ``ray.train.torch.get_device()`` returns ``torch.device("tpu")`` as on a real
  slice, and ``torch.tpu`` (``torch_tpu.device``) says no chip is available to torch.accelerator.
  No tensor can live there: the training function uses ``torch.device("cpu")``;
- ``torch_tpu._loader.load()`` registers the ``tpu_dist`` process-group backend, here carried by
  gloo over the hosts' CPUs, so ``TorchConfig(backend="tpu_dist")`` also initialises.
"""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

import torch

from torch_tpu import device

SIMULATED = True  # the real torch_tpu has no such attribute
DEVICE_TYPE = "tpu"
_MARKER = "tpuflow's CPU stand-in for ``torch_tpu``"  # how this file's docstring begins


def _is_stand_in(path: Path) -> bool:
    """Whether ``path`` is (a copy of) this file, e.g. the one a Ray runtime_env ships as well."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:200].startswith(f'"""{_MARKER}')
    except OSError:
        return False


def _refuse_to_shadow() -> None:
    """Raise if a real torch_tpu is importable from a later entry of sys.path."""
    here = Path(__file__).resolve().parents[1]
    rest = [p for p in sys.path if p and Path(p).resolve() != here]
    spec = importlib.machinery.PathFinder.find_spec(__name__, rest)
    if spec is not None and spec.origin and not _is_stand_in(Path(spec.origin)):
        raise ImportError(
            f"tpuflow's CPU stand-in for torch_tpu ({__file__}) would shadow the real torch_tpu at "
            f"{spec.origin}: remove {here} from PYTHONPATH (it belongs on the simulated cluster only)"
        )


def _name_tpu_device() -> None:
    """Make torch.device("tpu") valid: PyTorch's privateuse1 backend, named as TorchTPU names it."""
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", DEVICE_TYPE):
        raise ImportError(f"torch's privateuse1 backend is already named {current!r}; the stand-in needs 'tpu'")
    if current != DEVICE_TYPE:
        torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    if not hasattr(torch, DEVICE_TYPE):
        # torch.accelerator (every optimizer step) asks torch.tpu whether a chip is there
        torch._register_device_module(DEVICE_TYPE, device)


_refuse_to_shadow()
_name_tpu_device()

__all__ = ["DEVICE_TYPE", "SIMULATED"]
