"""Tensors on the ``tpu`` device, held in host memory.

A tensor on ``tpu`` is a ``TpuTensor``: a wrapper subclass (``_make_wrapper_subclass``, device
``tpu``) around a CPU tensor of the same shape and strides. Every ATen op on it reaches
``__torch_dispatch__`` (autograd runs above, as for any backend), which runs the op on the CPU
tensors inside and wraps the results again; tensor-less factory ops (``torch.empty(device="tpu")``
and what ``.to("tpu")``, ``torch.full``, ``torch.zeros``... build on) reach the PrivateUse1 kernels
registered below. Collectives are ops too (``c10d::allreduce_``, ``_c10d_functional.*``): they run
on the CPU tensors, over the process group's CPU backend (``torch_tpu._loader``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

DEVICE_TYPE = "tpu"


def tpu_device() -> torch.device:
    return torch.device(DEVICE_TYPE, 0)


class TpuTensor(torch.Tensor):
    """A tensor on the ``tpu`` device whose data is the CPU tensor ``inner``."""

    _inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> TpuTensor:
        assert inner.device.type == "cpu" and not isinstance(inner, TpuTensor), inner.device
        tensor = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.size(),
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=tpu_device(),
            requires_grad=False,
        )
        tensor._inner = inner
        return tensor

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"TpuTensor({self._inner!r})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors: dict[str, torch.Tensor], meta: None, size: Any, stride: Any) -> TpuTensor:
        return TpuTensor(inner_tensors["_inner"])

    # FSDP2 frees and re-allocates unsharded parameters through their storage; a wrapper has none of its own.
    def untyped_storage(self) -> torch.UntypedStorage:
        return self._inner.untyped_storage()

    def data_ptr(self) -> int:
        return self._inner.data_ptr()

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        wrappers: dict[int, torch.Tensor] = {}

        def unwrap(x: Any) -> Any:
            if isinstance(x, TpuTensor):
                wrappers[id(x._inner)] = x
                return x._inner
            if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
                return torch.device("cpu")
            return x

        inner_args = tree_map(unwrap, args)
        inner_kwargs = tree_map(unwrap, kwargs)
        target = kwargs.get("device")
        to_tpu = target.type == DEVICE_TYPE if isinstance(target, torch.device) else bool(wrappers)
        out = func(*inner_args, **inner_kwargs)

        def wrap(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not isinstance(x, TpuTensor):
                same = wrappers.get(id(x))
                if same is not None:  # in place or out=: the caller's own tensor
                    return same
                if to_tpu and x.device.type == "cpu":
                    return TpuTensor(x)
            return x

        return tree_map(wrap, out)


def _empty_memory_format(
    size: Any,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> torch.Tensor:
    return TpuTensor(torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format))


def _empty_strided(
    size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    return TpuTensor(torch.empty_strided(size, stride, dtype=dtype, layout=layout))


_LIBRARY: torch.library.Library | None = None


def register_factories() -> None:
    """PrivateUse1 kernels for the ops that make a tensor on ``tpu`` from no tensor (idempotent)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    _LIBRARY = lib
