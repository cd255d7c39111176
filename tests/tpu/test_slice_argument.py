"""tpuflow.tpu.slice_argument: the one ``tpu_slice`` argument every operator takes, in each accepted shape,
and its one-line refusals naming ``tpu_slice.<key>``."""

from __future__ import annotations

from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.tpu import TpuSlice
from tpuflow.tpu.slice_argument import resolve_slice, slice_is_templated, slice_spec

MULTI = TpuSlice.from_spec("v6e", "2x4", "ct6e-standard-4t", 2)


@pytest.mark.parametrize(
    "shape",
    [
        MULTI,
        MULTI.to_dict(),
        {"accelerator": "v6e", "topology": "2x4", "machine_type": "ct6e-standard-4t", "num_slices": 2},
        {"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t", "num_slices": "2"},
        {"accelerator": "tpu-v6e-slice", "topology": "2x4", "machine_type": "ct6e-standard-4t", "num_slices": 2},
    ],
    ids=["TpuSlice", "to_dict", "mapping", "ray-name-and-text-count", "gke-label"],
)
def test_every_accepted_shape_names_the_same_slice(shape: Any) -> None:
    assert resolve_slice(shape) == MULTI
    assert resolve_slice(slice_spec(shape)) == MULTI


def test_machine_type_and_num_slices_are_optional() -> None:
    assert resolve_slice({"accelerator": "v6e", "topology": "4x4"}) == TpuSlice.from_spec("v6e", "4x4")
    spec = slice_spec({"accelerator": "v6e", "topology": "4x4", "machine_type": ""})
    assert (spec["machine_type"], spec["num_slices"]) == (None, 1)


@pytest.mark.parametrize(
    "tpu",
    [MULTI, TpuSlice.from_spec("v5p", "2x2x4"), TpuSlice.from_spec("tpu7x", "2x2x2", num_slices=3)],
    ids=lambda t: t.summary(),
)
def test_a_tpu_slice_and_its_to_dict_round_trip(tpu: TpuSlice) -> None:
    assert resolve_slice(tpu) is tpu
    assert resolve_slice(tpu.to_dict()) == tpu
    assert resolve_slice(resolve_slice(tpu.to_dict()).to_dict()).to_dict() == tpu.to_dict()


@pytest.mark.parametrize(
    ("value", "field", "fix"),
    [
        ({"accelerator": "v6e", "topolgy": "4x4"}, "tpu_slice.topolgy", "takes only"),
        ({"accelerator": "v6e", "topology": "16"}, "tpu_slice.topology", "not a chip count"),
        ({"accelerator": "v6e", "topology": 16}, "tpu_slice.topology", "not a chip count"),
        ("v6e-4x4", "tpu_slice", "give a TpuSlice"),
        ({"topology": "4x4"}, "tpu_slice.accelerator", "give a TpuSlice"),
        ({"accelerator": "", "topology": "4x4"}, "tpu_slice.accelerator", "give a TpuSlice"),
        ({"accelerator": "v6e"}, "tpu_slice.topology", "give a TpuSlice"),
        ({"accelerator": "v9z", "topology": "4x4"}, "tpu_slice.accelerator", "v6e"),
        ({"accelerator": "v6e", "topology": "4x4", "num_slices": 0}, "tpu_slice.num_slices", "1 or more"),
        ({"accelerator": "v6e", "topology": "4x4", "num_slices": "two"}, "tpu_slice.num_slices", "whole number"),
    ],
    ids=["typo-key", "chip-count", "chip-count-int", "string", "no-accelerator", "empty-accelerator",
         "no-topology", "unknown-accelerator", "zero-slices", "text-slices"],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_field(value: Any, field: str, fix: str) -> None:
    with pytest.raises(UserInputError) as err:
        resolve_slice(value)
    assert err.value.field == field
    assert fix in err.value.fix
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{field}=")


def test_the_field_is_named_as_the_caller_says() -> None:
    with pytest.raises(UserInputError) as err:
        resolve_slice({"accelerator": "v6e", "topology": "16"}, "serve.tpu_slice")
    assert err.value.field == "serve.tpu_slice.topology"


@pytest.mark.parametrize(
    ("value", "templated"),
    [
        (MULTI, False),
        (MULTI.to_dict(), False),
        ({"accelerator": "v6e", "topology": "4x4"}, False),
        ({"accelerator": "v6e", "topology": "{{ params.topology }}"}, True),
        ({"accelerator": "v6e", "topology": "4x4", "num_slices": "{{ params.num_slices }}"}, True),
        ("{{ ti.xcom_pull(task_ids='check_params')['slice'] }}", True),
        ({"accelerator": "v6e", "topology": "{% if true %}4x4{% endif %}"}, True),
    ],
)
def test_templated_detection(value: Any, templated: bool) -> None:
    assert slice_is_templated(value) is templated
