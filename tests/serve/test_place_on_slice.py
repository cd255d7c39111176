"""place_on_slice: a multi-host replica's placement derived from the slice, the user's values never rewritten."""

from __future__ import annotations

import copy

import pytest

from tpuflow.errors import UserInputError
from tpuflow.serve.config import check_tpu_placement, place_on_slice, serve_application, serve_config, serve_tpu_args
from tpuflow.tpu import TpuSlice

V6E_4X4 = TpuSlice.from_spec("TPU-V6E", "4x4")


def user_app(**args):
    return serve_config([serve_application("chat", "acme_models.chat:build_app", args=args or None)])


def test_the_derived_args_are_the_slices_and_pass_the_deploy_check():
    given = user_app(model_dir="gs://acme/chat")
    before = copy.deepcopy(given)
    placed = place_on_slice(given, V6E_4X4)
    assert given == before  # the caller's config is not mutated
    assert placed["applications"][0]["args"] == {"model_dir": "gs://acme/chat", **serve_tpu_args(V6E_4X4)}
    check_tpu_placement(placed, V6E_4X4)
    with pytest.raises(UserInputError, match="hang in DEPLOYING"):
        check_tpu_placement(given, V6E_4X4)  # what the deploy check still refuses without the derivation


def test_single_host_or_no_slice_is_left_as_given():
    given = user_app()
    assert place_on_slice(given, TpuSlice.from_spec("TPU-V6E", "2x2")) is given
    assert place_on_slice(given, None) is given


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (
            {"accelerator_config": {"kind": "tpu", "topology": "8x8"}},
            "applications[chat].args.accelerator_config.topology",
        ),
        ({"accelerator_config": "4x4"}, "applications[chat].args.accelerator_config"),
        ({"chips_per_host": 8}, "applications[chat].args.chips_per_host"),
    ],
)
def test_a_contradiction_names_the_field(args, field):
    with pytest.raises(UserInputError) as err:
        place_on_slice(user_app(**args), V6E_4X4)
    assert err.value.field == field and "\n" not in str(err.value)


def test_a_file_referenced_llm_config_is_refused_in_one_line_by_the_deploy_check_too():
    cfg = serve_config([serve_application("llm", "ray.serve.llm:build_openai_app", args={"llm_configs": ["m.yaml"]})])
    with pytest.raises(UserInputError, match="inline"):
        check_tpu_placement(cfg, V6E_4X4)  # was an AttributeError
    check_tpu_placement(cfg, TpuSlice.from_spec("TPU-V6E", "2x2"))
