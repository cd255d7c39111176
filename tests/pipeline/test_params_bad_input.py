"""Every Param of the pipelines given a bad value: one UserInputError naming params.NAME, the value and the fix.

`check_conf` applies each Param's own JSON schema (what the trigger form and `airflow dags trigger -c`
enforce), then `validate_params` / `check_gke_params` the cross-field rules; `tpuflow demo` calls the
same functions on its flags (tests/cli/test_bad_input.py).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.pipeline.gke import check_gke_params
from tpuflow.pipeline.params import check_conf, check_param, pipeline_params, validate_params

# (conf, field, text of the fix)
SCHEMA_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"accelerator": "TPU-V9"}, "params.accelerator", "use one of TPU-V4"),
    ({"accelerator": ["TPU-V6E"]}, "params.accelerator", "use one of"),
    ({"machine_type": 4}, "params.machine_type", "give a string, or leave it empty"),
    ({"framework": "tf"}, "params.framework", "use one of jax, torch"),
    ({"train_steps": 0}, "params.train_steps", "give a whole number >= 1 and <= 100000"),
    ({"train_steps": 2.5}, "params.train_steps", "whole number"),
    ({"train_steps": True}, "params.train_steps", "whole number"),
    ({"train_steps": "100"}, "params.train_steps", "whole number"),
    ({"checkpoint_every": 0}, "params.checkpoint_every", "give a whole number >= 1 and <= 100000"),
    ({"checkpoint_every": 2.5}, "params.checkpoint_every", "whole number"),
    ({"accuracy_threshold": 1.5}, "params.accuracy_threshold", "give a number >= 0 and <= 1"),
    ({"accuracy_threshold": math.nan}, "params.accuracy_threshold", "finite"),
    ({"keep_endpoint": "yes"}, "params.keep_endpoint", "true or false"),
    ({"idle_timeout": -5}, "params.idle_timeout", ">= 0"),
    ({"idle_timeout": "soon"}, "params.idle_timeout", "number"),
    ({"num_train": 10}, "params.num_train", ">= 100"),
    ({"num_eval": 6000}, "params.num_eval", "<= 5000"),
    ({"max_chip_hours": 0}, "params.max_chip_hours", "> 0"),
    ({"max_chip_hours": math.inf}, "params.max_chip_hours", "finite"),
    ({"serve_topology": "9x9"}, "params.serve_topology", "use one of (empty)"),
    ({"resume": "sometimes"}, "params.resume", "use one of auto, never"),
    ({"steps": 10}, "params", "the pipeline's Params are"),
]

# Valid for each Param alone, rejected by the cross-field check (the slice catalog).
CROSS_CASES: list[tuple[dict[str, Any], str, str]] = [
    # the topology has no schema rule: only the cross-field check knows the generation's shapes
    ({"topology": 16}, "params.topology", "not a chip count; give a shape, e.g. 2x8, 4x4 (16 chips)"),
    ({"topology": "16"}, "params.topology", "not a chip count"),
    ({"topology": "3x3"}, "params.topology", "v6e has no such slice; valid shapes: 1x1, 2x2"),
    ({"accelerator": "TPU-V4", "topology": "16"}, "params.topology", "e.g. 2x2x4 (16 chips)"),
    ({"accelerator": "TPU-V6E", "topology": "2x2x2"}, "params.topology", "2D"),
    ({"accelerator": "TPU-V4", "topology": "4x4"}, "params.topology", "3D"),
    ({"machine_type": "ct5p-hightpu-4t"}, "params.machine_type", "ct6e"),
    ({"serve_topology": "2x4"}, "params.serve_topology", "simulates only the training slice"),
]


@pytest.mark.parametrize(("conf", "field", "fix"), SCHEMA_CASES, ids=[repr(c)[:40] for c, _, _ in SCHEMA_CASES])
def test_each_param_schema(conf: dict[str, Any], field: str, fix: str) -> None:
    with pytest.raises(UserInputError) as err:
        check_conf(conf)
    assert err.value.field == field
    assert fix in err.value.fix
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("conf", "field", "fix"), CROSS_CASES, ids=[repr(c)[:40] for c, _, _ in CROSS_CASES])
def test_cross_field_checks_after_the_schema(conf: dict[str, Any], field: str, fix: str) -> None:
    params = check_conf(conf)  # each value alone is fine
    with pytest.raises(UserInputError) as err:
        validate_params(params)
    assert err.value.field == field
    assert fix in err.value.fix


def test_gke_serve_slice_must_exist_on_gke() -> None:
    with pytest.raises(UserInputError) as err:
        check_gke_params(check_conf({"serve_topology": "2x2x1"}))
    assert err.value.field == "params.serve_topology"


def test_defaults_pass_and_are_returned() -> None:
    params = check_conf({})
    assert params == {name: p.value for name, p in pipeline_params().items()}
    assert validate_params(params)["topology"] == "4x4"
    assert check_param("train_steps", 10) == 10


@pytest.mark.parametrize(("accelerator", "shapes"), [("TPU-V6E", "2x8, 4x4"), ("TPU-V4", "2x2x4")])
def test_a_bad_topology_passes_airflows_validation_and_check_params_says_it_in_one_short_line(
    accelerator: str, shapes: str
) -> None:
    """Airflow validates a run's conf against the serialized Params before the run exists (trigger, `dags test -c`):
    an enum there refused a chip count with all 117 shapes of every generation and its whole schema (1,224
    characters and more, no hint). The topology has no such rule: check_params, the run's first task, refuses it
    with the hint and shapes of the chosen generation, before any lease, cluster or node pool."""
    from airflow.serialization.serialized_objects import BaseSerialization

    from tpuflow.pipeline.steps import CheckParamsOperator

    params = pipeline_params()
    conf = {"accelerator": accelerator, "topology": "16"}
    served = BaseSerialization._deserialize_params_dict(BaseSerialization._serialize_params_dict(params))
    assert served.deep_merge(conf).validate()["topology"] == "16"  # what create_dagrun runs: no refusal
    op = CheckParamsOperator(task_id="check_params")
    with pytest.raises(UserInputError) as err:
        op.execute({"params": {name: p.value for name, p in params.items()} | conf})
    line = str(err.value)
    assert line.startswith("params.topology='16' is invalid: a topology is the slice's shape, not a chip count")
    assert shapes in line and "\n" not in line and len(line) < 160, line
