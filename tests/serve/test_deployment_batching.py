"""Opt-in request batching of the demo app: it travels in deployment_options' user_config (with the
replica's other limits) untouched by the serve layer, Ray Serve's schema accepts the entry, the demo
workload's check names a bad value's field before deploy, and Ray Serve LLM (no user_config) refuses it."""

from __future__ import annotations

from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.serve.deployment_options import DeploymentOptions


def demo_config(options: dict[str, Any]) -> dict[str, Any]:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.steps import serve_config_for

    return serve_config_for({"backend": "local", "serve_port": 18124}, {"checkpoint": "/c"}, "local:///w", "jax",
                            deployment_options=options, workload=ADDITION)  # fmt: skip


def test_batching_goes_in_the_user_config_of_a_valid_serve_config() -> None:
    from ray.serve.schema import ServeDeploySchema

    batching = {"max_batch_size": 32, "batch_wait_timeout_s": 0.002}
    config = demo_config({"max_ongoing_requests": 64, "user_config": batching})
    (deployment,) = ServeDeploySchema.model_validate(config).applications[0].deployments
    assert deployment.max_ongoing_requests == 64
    assert deployment.user_config == batching
    assert DeploymentOptions().deployment_entry("D") == {"name": "D"}  # off unless asked for
    zero_wait = DeploymentOptions.from_value({"user_config": {"max_batch_size": 8, "batch_wait_timeout_s": 0}})
    assert zero_wait.deployment_entry("D")["user_config"] == {"max_batch_size": 8, "batch_wait_timeout_s": 0}


@pytest.mark.parametrize(
    ("user_config", "ongoing", "field"),
    [
        ({"max_batch_size": 0}, None, "deployment_options.user_config.max_batch_size"),
        ({"max_batch_size": True}, None, "deployment_options.user_config.max_batch_size"),
        (
            {"max_batch_size": 4, "batch_wait_timeout_s": -0.1},
            None,
            "deployment_options.user_config.batch_wait_timeout_s",
        ),
        ({"max_batch_size": 4, "batch_wait_timeout_s": float("inf")}, None, "deployment_options.user_config"),
        ({"batch_wait_timeout_s": 0.01}, None, "deployment_options.user_config.batch_wait_timeout_s"),
        ({"max_batch_size": 16}, 8, "deployment_options.user_config.max_batch_size"),
        ({"max_inflight_requests": 10}, 5, "deployment_options.user_config.max_inflight_requests"),
        ({"request_timeout_s": "30"}, None, "deployment_options.user_config.request_timeout_s"),
        ({"max_batch": 8}, None, "deployment_options.user_config"),
    ],
)
def test_bad_batching_settings_name_the_field(user_config: dict[str, Any], ongoing: int | None, field: str) -> None:
    options: dict[str, Any] = {"user_config": user_config}
    if ongoing is not None:
        options["max_ongoing_requests"] = ongoing
    with pytest.raises(UserInputError) as err:
        demo_config(options)
    assert err.value.field == field and "\n" not in str(err.value)


def test_the_demo_app_settings_outside_user_config_are_refused_with_the_fix() -> None:
    with pytest.raises(UserInputError, match="the app's own settings go in user_config") as err:
        DeploymentOptions.from_value({"max_batch_size": 8})
    assert err.value.field == "deployment_options"


@pytest.mark.parametrize("user_config", [{"max_batch_size": 8}, {"max_batch_size": 8, "batch_wait_timeout_s": 0}])
def test_ray_serve_llm_refuses_batching_settings(user_config: dict[str, Any]) -> None:
    with pytest.raises(UserInputError) as err:
        DeploymentOptions.from_value({"user_config": user_config}).llm_deployment_config()
    assert err.value.field == "deployment_options.user_config"
