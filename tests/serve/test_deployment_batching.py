"""Opt-in request batching as a Serve deployment setting: it travels in the addition app's user_config
(with the replica's other limits), Ray Serve's schema accepts the entry, bad values name the field,
and Ray Serve LLM (which has no such setting) refuses it."""

from __future__ import annotations

from typing import Any

import pytest
from tpuflow.errors import UserInputError
from tpuflow.serve.deployment_options import USER_CONFIG_KEYS, DeploymentOptions


def test_batching_goes_in_the_user_config_of_a_valid_serve_config() -> None:
    from ray.serve.schema import ServeDeploySchema
    from tpuflow.pipeline.steps import serve_config_for
    from tpuflow.workloads.addition.pipeline import ADDITION

    options = {"max_ongoing_requests": 64, "max_batch_size": 32, "batch_wait_timeout_s": 0.002}
    config = serve_config_for({"backend": "local", "serve_port": 18124}, {"checkpoint": "/c"}, "local:///w", "jax",
                              deployment_options=options, workload=ADDITION)  # fmt: skip
    (deployment,) = ServeDeploySchema.model_validate(config).applications[0].deployments
    assert deployment.max_ongoing_requests == 64
    assert deployment.user_config == {"max_batch_size": 32, "batch_wait_timeout_s": 0.002}
    assert DeploymentOptions().user_config() == {}  # off unless asked for
    # the keys the replica reads (addition.openai_api.Limits)
    assert {"max_batch_size", "batch_wait_timeout_s"} <= set(USER_CONFIG_KEYS)
    zero_wait = DeploymentOptions.from_value({"max_batch_size": 8, "batch_wait_timeout_s": 0})
    assert zero_wait.user_config() == {"max_batch_size": 8, "batch_wait_timeout_s": 0}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_batch_size": 0}, "deployment_options.max_batch_size"),
        ({"max_batch_size": True}, "deployment_options.max_batch_size"),
        ({"max_batch_size": 4, "batch_wait_timeout_s": -0.1}, "deployment_options.batch_wait_timeout_s"),
        ({"max_batch_size": 4, "batch_wait_timeout_s": float("nan")}, "deployment_options.batch_wait_timeout_s"),
        ({"batch_wait_timeout_s": 0.01}, "deployment_options.batch_wait_timeout_s"),
        ({"max_batch_size": 16, "max_ongoing_requests": 8}, "deployment_options.max_batch_size"),
    ],
)
def test_bad_batching_settings_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(UserInputError) as err:
        DeploymentOptions.from_value(options)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_batch_size": 8}, "deployment_options.max_batch_size"),
        ({"max_batch_size": 8, "batch_wait_timeout_s": 0}, "deployment_options.max_batch_size"),
    ],
)
def test_ray_serve_llm_refuses_batching_settings(options: dict[str, Any], field: str) -> None:
    with pytest.raises(UserInputError) as err:
        DeploymentOptions.from_value(options).llm_deployment_config()
    assert err.value.field == field
