"""tpuflow's CPU stand-in for ``torch_tpu`` (TorchTPU), for the simulated TPU slice only.

tpuflow's local cluster puts ``workloads/simulated_tpu`` on the path of every process it starts
(head and simulated hosts), and nowhere else: a machine with the real ``torch_tpu`` never sees
this package. Importing it refuses to run where a real TorchTPU is installed further down the path.

It makes ``tpu`` a torch device whose memory is the host's, so scripts written for TorchTPU run
unchanged on hosts without chips:

- ``torch.device("tpu")`` holds tensors (``torch_tpu._tensor.TpuTensor``: every op runs on the CPU
  tensor inside), with autograd, ``nn.Module.to``, DeviceMesh/DTensor and FSDP2 on top, and
  ``torch.tpu`` (``torch_tpu.device``) answering DeviceMesh and torch.accelerator;
- ``import torch_tpu`` succeeds, so Ray Train's ``TPUTorchDeviceManager`` is available and
  ``ray.train.torch.get_device()`` is ``tpu`` as on a real slice;
- the ``tpu_dist`` process-group backend exists from the import on (and ``torch_tpu._loader.load()``,
  which Ray calls, is idempotent): gloo over the hosts' CPUs, for tensors on ``tpu`` and ``cpu``.
"""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path


def autoload() -> None:
    """torch's device-backend autoload entry point (``torch.backends``, this folder's dist-info): importing
    torch anywhere on the simulated cluster (a Ray actor whose script imported torch_tpu only in the
    driver included) makes the ``tpu`` device and ``tpu_dist``, as an installed TorchTPU does. The work
    is this package's import; defined before ``import torch``, which runs it when torch_tpu comes first."""


import torch  # noqa: E402

from torch_tpu import _loader, _tensor, device  # noqa: E402

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


def _make_tpu_device() -> None:
    """torch.device("tpu") with tensors on it: PyTorch's privateuse1 backend, named as TorchTPU names it."""
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", DEVICE_TYPE):
        raise ImportError(f"torch's privateuse1 backend is already named {current!r}; the stand-in needs 'tpu'")
    if not hasattr(torch, DEVICE_TYPE):
        torch.utils.backend_registration._setup_privateuseone_for_python_backend(
            rename=DEVICE_TYPE if current != DEVICE_TYPE else None, backend_module=device
        )
    _tensor.register_factories()


_refuse_to_shadow()
_make_tpu_device()
_loader.load()

__all__ = ["DEVICE_TYPE", "SIMULATED", "TpuTensor"]

TpuTensor = _tensor.TpuTensor
