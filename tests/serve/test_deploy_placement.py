"""The Serve deploy operator places a multi-host app on its tpu_slice: what the app's args leave out is
derived from the slice and logged, what they declare is kept, and a contradiction is refused in one line
before anything is deployed. No Ray: a recording hook stands in for the dashboard."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from support.airflow_context import task_context

from tpuflow.errors import UserInputError
from tpuflow.serve.config import serve_application, serve_config, serve_tpu_args
from tpuflow.serve.operators import RayServeDeployOperator
from tpuflow.tpu import TpuSlice

V6E_4X4 = TpuSlice.from_spec("v6e", "4x4")
CLUSTER = {"dashboard_url": "http://127.0.0.1:1", "serve_url": "http://127.0.0.1:2"}


def user_config(**args: Any) -> dict[str, Any]:
    return serve_config([serve_application("chat", "acme_chat.app:build_app", args=args or None)])


class RecordingHook:
    """The dashboard's part the deploy uses before it waits: what is on the cluster, and the PUT."""

    dashboard_url, serve_url = CLUSTER["dashboard_url"], CLUSTER["serve_url"]

    def __init__(self) -> None:
        self.deployed: list[dict[str, Any]] = []

    def get_serve_details(self) -> dict[str, Any]:
        return {"applications": {}}

    def deploy_applications(self, config: dict[str, Any]) -> None:
        self.deployed.append(copy.deepcopy(config))


def deploy(config: dict[str, Any], tpu_slice: Any) -> tuple[RayServeDeployOperator, RecordingHook]:
    """Run the deploy task up to its wait (it defers); the hook holds what was PUT."""
    return run_deploy(
        RayServeDeployOperator(task_id="deploy", serve_config=config, cluster=CLUSTER, tpu_slice=tpu_slice)
    )


def run_deploy(op: RayServeDeployOperator) -> tuple[RayServeDeployOperator, RecordingHook]:
    hook = RecordingHook()
    op.hook = lambda: hook  # type: ignore[method-assign]
    with pytest.raises(TaskDeferred):
        op.execute(task_context())
    return op, hook


def test_a_multi_host_app_without_its_placement_is_deployed_with_the_slices(capfd: pytest.CaptureFixture[str]) -> None:
    given = user_config(model_dir="gs://acme/chat")
    before = copy.deepcopy(given)
    op, hook = deploy(given, {"accelerator": "v6e", "topology": "4x4"})
    (sent,) = hook.deployed
    assert sent["applications"][0]["args"] == {"model_dir": "gs://acme/chat", **serve_tpu_args(V6E_4X4)}
    assert op.serve_config == before  # what the user declared is not rewritten
    out = capfd.readouterr().out
    lines = [line for line in out.splitlines() if "derived" in line]
    assert len(lines) == 1, out
    assert "accelerator_config.topology=4x4" in lines[0] and "accelerator_type=TPU-V6E" in lines[0]
    assert "chips_per_host=4" in lines[0] and "for app chat from the v6e 4x4 slice" in lines[0]


def test_a_partly_declared_placement_is_completed_and_a_full_one_sent_as_given(
    capfd: pytest.CaptureFixture[str],
) -> None:
    _, hook = deploy(user_config(accelerator_config={"kind": "tpu"}), V6E_4X4.to_dict())
    assert hook.deployed[0]["applications"][0]["args"]["accelerator_config"] == {"kind": "tpu", "topology": "4x4"}
    assert (
        "derived accelerator_config.topology=4x4, accelerator_type=TPU-V6E, chips_per_host=4 for app chat"
        in capfd.readouterr().out
    )
    full = user_config(**serve_tpu_args(V6E_4X4))
    _, hook = deploy(full, V6E_4X4.to_dict())
    assert hook.deployed == [full] and "derived" not in capfd.readouterr().out


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (
            {"accelerator_config": {"kind": "tpu", "topology": "8x8"}},
            "applications[chat].args.accelerator_config.topology",
        ),
        ({"accelerator_type": "TPU-V5P"}, "applications[chat].args.accelerator_type"),
        ({"chips_per_host": 8}, "applications[chat].args.chips_per_host"),
    ],
)
def test_a_declared_value_the_slice_contradicts_is_refused_at_parse_time(args: dict[str, Any], field: str) -> None:
    with pytest.raises(UserInputError) as err:
        RayServeDeployOperator(
            task_id="deploy", serve_config=user_config(**args), cluster=CLUSTER, tpu_slice=V6E_4X4.to_dict()
        )
    assert err.value.field == field and "\n" not in str(err.value)
    assert "v6e 4x4" in str(err.value) and "leave it out" in str(err.value)


def test_a_templated_config_is_placed_once_rendered_and_a_contradiction_deploys_nothing() -> None:
    op = RayServeDeployOperator(task_id="deploy", serve_config="{{ params.cfg }}", cluster=CLUSTER,
                                tpu_slice=V6E_4X4.to_dict())  # fmt: skip
    op.serve_config = user_config(accelerator_config={"kind": "tpu", "topology": "2x4"})  # rendered (as native)
    hook = RecordingHook()
    op.hook = lambda: hook  # type: ignore[method-assign]
    with pytest.raises(UserInputError, match="accelerator_config.topology"):
        op.execute(task_context())
    assert hook.deployed == []


def test_single_host_and_no_slice_deploy_the_config_as_given() -> None:
    given = user_config(model_dir="m")
    for tpu_slice in (None, {"accelerator": "v6e", "topology": "2x2"}):
        _, hook = deploy(given, tpu_slice)
        assert hook.deployed == [given]


def test_every_shape_of_the_slice_places_the_app_alike() -> None:
    given = user_config(model_dir="m")
    shapes = (V6E_4X4, V6E_4X4.to_dict(), {"accelerator": "TPU-V6E", "topology": "4x4"})
    deployed = [deploy(given, shape)[1].deployed for shape in shapes]
    assert deployed[0] == deployed[1] == deployed[2] and deployed[0][0] != given


def test_a_templated_slice_is_rendered_then_placed_and_a_bad_one_deploys_nothing() -> None:
    templated = {"accelerator": "{{ params.accelerator }}", "topology": "{{ params.topology }}"}
    op = RayServeDeployOperator(task_id="deploy", serve_config=user_config(), cluster=CLUSTER, tpu_slice=templated)
    op.render_template_fields({"params": {"accelerator": "v6e", "topology": "4x4"}})
    assert op.tpu_slice == {"accelerator": "v6e", "topology": "4x4"}
    _, hook = run_deploy(op)
    assert hook.deployed[0]["applications"][0]["args"] == serve_tpu_args(V6E_4X4)
    bad = RayServeDeployOperator(task_id="deploy", serve_config=user_config(), cluster=CLUSTER, tpu_slice=templated)
    bad.render_template_fields({"params": {"accelerator": "v6e", "topology": "16"}})
    hook = RecordingHook()
    bad.hook = lambda: hook  # type: ignore[method-assign]
    with pytest.raises(UserInputError, match=r"^tpu_slice\.topology='16'"):
        bad.execute(task_context())
    assert hook.deployed == []


def test_a_bad_static_slice_and_the_old_serve_slice_are_refused_at_parse_time() -> None:
    with pytest.raises(UserInputError) as err:
        RayServeDeployOperator(task_id="deploy", serve_config=user_config(), cluster=CLUSTER,
                               tpu_slice={"accelerator": "v6e", "topolgy": "4x4"})  # fmt: skip
    assert err.value.field == "tpu_slice.topolgy" and "\n" not in str(err.value)
    # checked at parse time even while the Serve config is still a template
    with pytest.raises(UserInputError) as err:
        RayServeDeployOperator(task_id="deploy", serve_config="{{ params.cfg }}", cluster=CLUSTER, tpu_slice="v6e")
    assert err.value.field == "tpu_slice"
    with pytest.raises(TypeError, match="serve_slice"):
        RayServeDeployOperator(task_id="deploy", serve_config=user_config(), cluster=CLUSTER, serve_slice=V6E_4X4)
