"""The TPU slice catalog: one definition of a slice, from which every shape derives.

Names load on first use (PEP 562), so importing the generation table alone (as the pipeline's
Params do at DAG parse time) does not also load the slice arithmetic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuflow.tpu.generations import GENERATIONS, Generation
    from tpuflow.tpu.slice import SliceSpecError, TpuSlice, resolve_generation

_WHERE = {
    "GENERATIONS": "tpuflow.tpu.generations",
    "Generation": "tpuflow.tpu.generations",
    "SliceSpecError": "tpuflow.tpu.slice",
    "TpuSlice": "tpuflow.tpu.slice",
    "resolve_generation": "tpuflow.tpu.slice",
}

__all__ = ["GENERATIONS", "Generation", "SliceSpecError", "TpuSlice", "resolve_generation"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
