"""The one slice argument every operator takes: ``tpu_slice``.

Every operator that provisions, starts, checks or runs on a slice (node pool, capacity request,
RayCluster / RayService, local cluster, preflight, training, Serve) takes the slice in one argument
of one shape, so a DAG declares it once and hands the same value to each task:

- a :class:`~tpuflow.tpu.slice.TpuSlice` (``TpuSlice.from_spec("v6e", "4x4")``), or its ``to_dict()``;
- a mapping ``{"accelerator": ..., "topology": ..., "machine_type": ..., "num_slices": ...}``
  (``machine_type`` and ``num_slices`` optional) whose values may be Jinja templates, e.g. the
  slice ``check_params`` published (``tpuflow.pipeline.factory.checked_slice()``).

A static value is checked when the DAG file is parsed; a templated one once rendered, before
anything billable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from tpuflow.errors import UserInputError
from tpuflow.templating import is_templated

if TYPE_CHECKING:
    from tpuflow.tpu.slice import TpuSlice

SliceArgument: TypeAlias = "TpuSlice | Mapping[str, Any]"

FIELD = "tpu_slice"
SPEC_KEYS = ("accelerator", "topology", "machine_type", "num_slices")
_FIX = (
    'give a TpuSlice, its to_dict(), or {"accelerator": "v6e", "topology": "4x4"} (optional machine_type, num_slices)'
)


def slice_is_templated(value: Any) -> bool:
    """True while the slice (or one of its fields) is rendered only at run time (a TpuSlice is static)."""
    return is_templated(value)


def slice_spec(value: Any, field: str = FIELD) -> dict[str, Any]:
    """The slice's four defining fields from any accepted shape (rendered), or one line naming the field."""
    from tpuflow.tpu.slice import TpuSlice

    if isinstance(value, TpuSlice):
        return {
            "accelerator": value.generation.ray_accelerator_type,
            "topology": value.topology,
            "machine_type": value.machine_type,
            "num_slices": value.num_slices,
        }
    if not isinstance(value, Mapping):
        raise UserInputError(field, value, _FIX)
    data = dict(value)
    if "generation" in data and "accelerator" not in data:  # TpuSlice.to_dict(): the derived keys ride along
        data = {"accelerator": data["generation"], **{k: data[k] for k in SPEC_KEYS[1:] if k in data}}
    unknown = sorted(set(data) - set(SPEC_KEYS))
    if unknown:
        raise UserInputError(f"{field}.{unknown[0]}", data[unknown[0]], f"{field} takes only {', '.join(SPEC_KEYS)}")
    for key in ("accelerator", "topology"):
        if not data.get(key):
            raise UserInputError(f"{field}.{key}", data.get(key), _FIX)
    return {
        "accelerator": data["accelerator"],
        "topology": data["topology"],
        "machine_type": data.get("machine_type") or None,
        "num_slices": 1 if data.get("num_slices") is None else data["num_slices"],  # 0 is refused, not 1
    }


def resolve_slice(value: Any, field: str = FIELD, *, gke: bool = False, ray: bool = False) -> TpuSlice:
    """The TpuSlice a (rendered) slice argument names, in a shape GKE (``gke``) and / or Ray (``ray``) can
    place; bad input is one line naming ``<field>.<key>``."""
    from tpuflow.tpu.slice import SliceSpecError, TpuSlice

    try:
        if isinstance(value, TpuSlice):
            tpu = value
        else:
            spec = slice_spec(value, field)
            tpu = TpuSlice.from_spec(spec["accelerator"], spec["topology"], spec["machine_type"], spec["num_slices"])
        return tpu.require(gke=gke, ray=ray) if gke or ray else tpu
    except SliceSpecError as err:
        raise SliceSpecError(f"{field}.{err.field}", err.value, err.fix) from None
