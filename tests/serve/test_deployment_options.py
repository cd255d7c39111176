"""Serve deployment settings: checked up front, and what they produce is what Ray Serve's own schema accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.serve.deployment_options import DeploymentOptions


def serve_schema() -> Any:
    from ray.serve.schema import ServeDeploySchema

    return ServeDeploySchema


def test_autoscaling_and_limits_become_a_valid_serve_config() -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION, SERVE_DEPLOYMENT

    from tpuflow.pipeline.steps import serve_config_for

    options = {
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8},
        "max_ongoing_requests": 32,
        "max_queued_requests": 100,
        "request_timeout_s": 30,
        "graceful_shutdown_timeout_s": 5,
        "user_config": {"request_timeout_s": 30, "max_inflight_requests": 24},
    }
    cluster = {"backend": "local", "serve_port": 18123}
    config = serve_config_for(
        cluster, {"checkpoint": "/ckpt"}, "local:///w", "jax", deployment_options=options, workload=ADDITION
    )
    parsed = serve_schema().model_validate(config)
    assert parsed.http_options.request_timeout_s == 30 and parsed.http_options.port == 18123
    (deployment,) = parsed.applications[0].deployments
    assert deployment.name == SERVE_DEPLOYMENT
    assert (deployment.num_replicas, deployment.max_ongoing_requests, deployment.max_queued_requests) == (
        "auto",
        32,
        100,
    )
    assert deployment.autoscaling_config["max_replicas"] == 4
    assert deployment.user_config == {"request_timeout_s": 30, "max_inflight_requests": 24}


def test_no_options_leave_the_config_as_before() -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.steps import serve_config_for

    config = serve_config_for({"backend": "kuberay"}, {"checkpoint": "/c"}, "gs://b/w.zip", "torch", workload=ADDITION)
    assert "deployments" not in config["applications"][0] and "http_options" not in config
    fixed = DeploymentOptions(num_replicas=2, max_ongoing_requests=64).validated()
    assert fixed.deployment_entry("D") == {"name": "D", "num_replicas": 2, "max_ongoing_requests": 64}
    assert fixed.llm_deployment_config() == {"num_replicas": 2, "max_ongoing_requests": 64}
    assert fixed.http_options() == {} and DeploymentOptions().is_empty() and not fixed.is_empty()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"num_replica": 2}, "deployment_options"),
        ({"num_replicas": 0}, "deployment_options.num_replicas"),
        ({"num_replicas": True}, "deployment_options.num_replicas"),
        ({"num_replicas": 2, "autoscaling_config": {"max_replicas": 2}}, "deployment_options.num_replicas"),
        ({"autoscaling_config": {"max_replica": 2}}, "deployment_options.autoscaling_config"),
        ({"autoscaling_config": {}}, "deployment_options.autoscaling_config"),
        (
            {"autoscaling_config": {"min_replicas": 3, "max_replicas": 2}},
            "deployment_options.autoscaling_config.min_replicas",
        ),
        (
            {"autoscaling_config": {"max_replicas": 4, "initial_replicas": 5}},
            "deployment_options.autoscaling_config.initial_replicas",
        ),
        (
            {"autoscaling_config": {"target_ongoing_requests": 0}},
            "deployment_options.autoscaling_config.target_ongoing_requests",
        ),
        ({"max_ongoing_requests": 0}, "deployment_options.max_ongoing_requests"),
        ({"max_queued_requests": 0}, "deployment_options.max_queued_requests"),
        ({"request_timeout_s": -1}, "deployment_options.request_timeout_s"),
        ({"request_timeout_s": "30"}, "deployment_options.request_timeout_s"),
        ({"max_inflight_requests": 10}, "deployment_options"),  # an app's own setting: in user_config
        ({"user_config": [("max_batch_size", 8)]}, "deployment_options.user_config"),
        ({"user_config": {"limit": float("nan")}}, "deployment_options.user_config"),
        ({"user_config": {"model": object()}}, "deployment_options.user_config"),
    ],
)
def test_bad_settings_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(UserInputError) as err:
        DeploymentOptions.from_value(options)
    assert err.value.field == field


@pytest.mark.parametrize(
    "options",
    [
        {"num_replicas": 3, "max_ongoing_requests": 8, "max_queued_requests": -1},
        {"autoscaling_config": {"min_replicas": 0, "max_replicas": 3, "downscale_delay_s": 0}},
        {"health_check_period_s": 2, "health_check_timeout_s": 5, "graceful_shutdown_timeout_s": 1},
        {"max_ongoing_requests": 8, "user_config": {"threshold": 0.5, "labels": ["a", "b"], "nested": {"k": 1}}},
    ],
)
def test_every_accepted_setting_is_accepted_by_ray_serve(options: dict[str, Any]) -> None:
    from ray.serve.schema import DeploymentSchema

    entry = DeploymentOptions.from_value(options).deployment_entry("D")
    parsed = DeploymentSchema.model_validate(entry)
    assert parsed.model_dump(exclude_unset=True) == entry


def test_build_serve_config_operator_checks_static_options_at_parse_time() -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.steps import BuildServeConfigOperator

    common = {"cluster": {}, "trained": {"checkpoint": "/c"}, "workloads_uri": "w", "workload": ADDITION}
    with pytest.raises(UserInputError) as err:
        BuildServeConfigOperator(task_id="cfg", deployment_options={"x": 1}, **common)
    assert err.value.field == "deployment_options"
    # checked when the task runs
    templated = BuildServeConfigOperator(task_id="cfg2", deployment_options="{{ params.d }}", **common)
    assert templated.deployment_options == "{{ params.d }}"


def _user_workload(**kw: Any) -> Any:
    from tpuflow.pipeline.workload import Workload

    return Workload(train_loop="acme_rank.fit:loop", serve_app="acme_rank.app:build", serve_deployment="Ranker", **kw)


CHECK = """
from tpuflow.errors import UserInputError

def check(user_config, deployment):
    if user_config.get("top_k", 0) > deployment.get("max_ongoing_requests", 100):
        raise UserInputError("deployment_options.user_config.top_k", user_config["top_k"], "keep it <= max_ongoing_requests")
"""


def test_a_workloads_user_config_defaults_pass_through_under_the_runs_own(tmp_path: Path) -> None:
    """The serve layer knows no app's keys: the workload's defaults and deployment_options' user_config are merged
    and passed as given; the workload's own check sees the merged user_config and the deployment entry."""
    from tpuflow.pipeline.steps import serve_config_for

    package = tmp_path / "acme_rank"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "checks.py").write_text(CHECK)
    workload = _user_workload(
        code_dir=package,
        serve_user_config={"top_k": 10, "cache": True},
        check_serve_user_config="acme_rank.checks:check",
    )
    cluster, trained = {"backend": "kuberay"}, {"checkpoint": "gs://b/c"}

    def build(options: Any) -> dict[str, Any]:
        (app,) = serve_config_for(cluster, trained, "gs://b/w.zip", "jax", workload=workload,
                                  deployment_options=options)["applications"]  # fmt: skip
        return app

    assert build(None)["deployments"] == [{"name": "Ranker", "user_config": {"top_k": 10, "cache": True}}]
    merged = build({"max_ongoing_requests": 4, "user_config": {"top_k": 3}})["deployments"]
    assert merged == [{"name": "Ranker", "max_ongoing_requests": 4, "user_config": {"top_k": 3, "cache": True}}]
    with pytest.raises(UserInputError) as err:
        build({"max_ongoing_requests": 4})  # the default top_k 10 > 4: the workload's check refuses it
    assert err.value.field == "deployment_options.user_config.top_k"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"serve_user_config": {"k": float("inf")}}, "workload.serve_user_config"),
        ({"serve_user_config": "top_k=3"}, "workload.serve_user_config"),
        ({"check_serve_user_config": "acme_rank/checks.py"}, "workload.check_serve_user_config"),
    ],
)
def test_a_bad_workload_user_config_names_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(UserInputError) as err:
        _user_workload(**kw)
    assert err.value.field == field and "\n" not in str(err.value)
