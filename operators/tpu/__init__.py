"""The TPU slice catalog: one definition of a slice, from which every shape derives."""

from operators.tpu.generations import GENERATIONS, Generation
from operators.tpu.slice import SliceSpecError, TpuSlice, resolve_generation

__all__ = ["GENERATIONS", "Generation", "SliceSpecError", "TpuSlice", "resolve_generation"]
