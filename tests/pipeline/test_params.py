"""Bad Params fail at trigger time (schema) or in the first task, naming the Param."""

from __future__ import annotations

import pytest
from airflow.sdk import Param
from tpuflow.errors import UserInputError
from tpuflow.pipeline.params import pipeline_params, validate_params


def defaults() -> dict:
    return {k: p.value for k, p in pipeline_params().items()}


def test_defaults_are_valid_and_describe_the_slice():
    assert validate_params(defaults())["num_hosts"] == 4


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"framework": "tensorflow"}, "params.framework"),
        ({"accuracy_threshold": 1.5}, "params.accuracy_threshold"),
        ({"accuracy_threshold": -0.1}, "params.accuracy_threshold"),
        ({"topology": "2x2x2"}, "params.topology"),  # v6e is 2D
        ({"accelerator": "TPU-V5P", "topology": "4x4"}, "params.topology"),
        ({"machine_type": "ct6e-standard-8t"}, "params.machine_type"),
    ],
)
def test_cross_field_validation_names_the_param(override, field):
    with pytest.raises(UserInputError) as err:
        validate_params({**defaults(), **override})
    assert err.value.field == field


@pytest.mark.parametrize(("name", "bad"), [("framework", "mxnet"), ("accuracy_threshold", 2), ("topology", "16")])
def test_form_schema_rejects_bad_values_at_trigger_time(name, bad):
    param: Param = pipeline_params()[name]
    with pytest.raises(Exception, match="valid|enum|greater|less|maximum"):
        Param(bad, **param.schema).resolve()
