"""One Serve config for both backends; a multi-host model without a topology is refused up front."""

from __future__ import annotations

import pytest

from tpuflow.errors import UserInputError
from tpuflow.serve.config import check_tpu_placement, serve_application, serve_config, serve_tpu_args
from tpuflow.serve.status import judge, placement_causes
from tpuflow.tpu import TpuSlice


def test_local_config_pins_proxy_to_loopback_port():
    cfg = serve_config([serve_application("a", "m:app", route_prefix="/a")], http_port=18000)
    assert cfg == {
        "proxy_location": "HeadOnly",
        "applications": [{"name": "a", "import_path": "m:app", "route_prefix": "/a"}],
        "http_options": {"host": "127.0.0.1", "port": 18000},
    }
    assert "http_options" not in serve_config([serve_application("a", "m:app")])


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: serve_application("a", "noimport"), "import_path"),
        (lambda: serve_application("a", "m:app", route_prefix="a"), "route_prefix"),
        (lambda: serve_config([]), "applications"),
        (lambda: serve_config([serve_application("a", "m:x"), serve_application("a", "m:y")]), "applications"),
        (lambda: serve_config([{"name": "a", "import_path": "m:x", "num_replica": 2}]), "applications[a]"),
    ],
)
def test_bad_config_names_the_field(call, field):
    with pytest.raises(UserInputError) as err:
        call()
    assert err.value.field == field


def llm_app(**llm):
    return serve_config([serve_application("llm", "ray.serve.llm:build_openai_app", args={"llm_configs": [llm]})])


def test_multi_host_model_without_topology_is_rejected_before_deploy():
    tpu = TpuSlice.from_spec("TPU-V6E", "4x4")
    with pytest.raises(UserInputError, match="hang in DEPLOYING") as err:
        check_tpu_placement(llm_app(model_loading_config={"model_id": "m"}, accelerator_type="TPU-V6E"), tpu)
    assert "'topology': '4x4'" in str(err.value)
    with pytest.raises(UserInputError):  # a topology for another shape is as bad as none
        check_tpu_placement(
            llm_app(accelerator_type="TPU-V6E", accelerator_config={"kind": "tpu", "topology": "2x4"}), tpu
        )
    check_tpu_placement(llm_app(**tpu.serve_accelerator_config()), tpu)
    # Single-host slices cannot straddle, so nothing is required there.
    check_tpu_placement(llm_app(accelerator_type="TPU-V6E"), TpuSlice.from_spec("TPU-V6E", "2x2"))


def test_status_judgement():
    running = {"applications": {"a": {"status": "RUNNING", "deployments": {"D": {"status": "HEALTHY"}}}}}
    assert judge(running, ["a"]).state == "running"
    failed = {
        "applications": {
            "a": {
                "status": "DEPLOY_FAILED",
                "message": "boom",
                "deployments": {"D": {"status": "UNHEALTHY", "message": "ImportError: x"}},
            }
        }
    }
    verdict = judge(failed, ["a"])
    assert verdict.state == "failed" and "ImportError: x" in verdict.detail and "deployment D" in verdict.detail
    deploying = {
        "applications": {
            "a": {
                "status": "DEPLOYING",
                "deployments": {"D": {"status": "UPDATING", "message": "waiting for replicas"}},
            }
        }
    }
    assert judge(deploying, ["a"]).state == "waiting"
    assert judge({"applications": {}}, ["a"]).detail == "application a: not deployed yet"


def addition_app(tpu: TpuSlice, **args):
    return serve_config(
        [
            serve_application(
                "addition", "addition.serve_app:app_builder", args={"checkpoint": "/c", **serve_tpu_args(tpu), **args}
            )
        ]
    )


def test_serve_tpu_args_derive_from_the_slice():
    assert serve_tpu_args(TpuSlice.from_spec("TPU-V6E", "4x4")) == {
        "accelerator_type": "TPU-V6E",
        "accelerator_config": {"kind": "tpu", "topology": "4x4"},
        "chips_per_host": 4,
    }
    assert serve_tpu_args(TpuSlice.from_spec("tpu7x", "2x2x2"))["tpu_resource_per_chip"] == 2
    check_tpu_placement(addition_app(TpuSlice.from_spec("TPU-V6E", "4x4", num_slices=2), num_replicas=2), None)
    check_tpu_placement(
        addition_app(TpuSlice.from_spec("TPU-V6E", "4x4", num_slices=2), num_replicas=2),
        TpuSlice.from_spec("TPU-V6E", "4x4", num_slices=2),
    )


@pytest.mark.parametrize(
    ("tpu", "app_tpu", "args", "field", "fix"),
    [
        # more replicas than slices: each multi-host replica takes a whole slice
        ("4x4", "4x4", {"num_replicas": 2}, "applications[addition].args.num_replicas", "holds 1 4x4 slice"),
        # single-host: 4 hosts of 4 chips hold 4 replicas of 4 chips
        ("2x2", "2x2", {"num_replicas": 5}, "applications[addition].args.num_replicas", "lower num_replicas to 1"),
        # a replica asking for more TPU than a host has
        ("2x2", "2x2", {"chips_per_host": 8}, "applications[addition].args.chips_per_host", "has 4 TPU"),
        # the multi-host deployment without its topology
        ("4x4", "4x4", {"accelerator_config": {"kind": "tpu"}}, "applications[addition].args", "hang in DEPLOYING"),
    ],
)
def test_bad_tpu_placement_is_refused_before_deploy(tpu, app_tpu, args, field, fix):
    with pytest.raises(UserInputError) as err:
        check_tpu_placement(
            addition_app(TpuSlice.from_spec("TPU-V6E", app_tpu), **args), TpuSlice.from_spec("TPU-V6E", tpu)
        )
    assert err.value.field == field and fix in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_deployment_override_asking_more_tpu_than_a_host_is_refused():
    tpu = TpuSlice.from_spec("TPU-V6E", "2x2")
    cfg = serve_config(
        [serve_application("a", "m:app", deployments=[{"name": "D", "ray_actor_options": {"resources": {"TPU": 8}}}])]
    )
    with pytest.raises(UserInputError, match="has 4 TPU"):
        check_tpu_placement(cfg, tpu)


def test_a_stuck_per_chip_deployment_is_named_with_the_missing_topology():
    payload = {
        "applications": {
            "straddle": {
                "status": "DEPLOYING",
                "deployed_app_config": {
                    "args": {
                        "accelerator_type": "TPU-V6E",
                        "accelerator_config": {"kind": "tpu"},
                        "chips_per_host": 4,
                        "num_devices": 8,
                    }
                },
                # What Serve's status reports: no placement_group_bundles.
                "deployments": {"AdditionCompletions": {"status": "UPDATING", "deployment_config": {"name": "x"}}},
            }
        }
    }
    (cause,) = placement_causes(payload, ["straddle"])
    assert (
        "AdditionCompletions" in cause and "8 per-chip TPU bundles" in cause and "accelerator_config.topology" in cause
    )
    args = payload["applications"]["straddle"]["deployed_app_config"]["args"]
    args["num_devices"] = 4  # one host's chips: nothing to straddle
    assert placement_causes(payload, ["straddle"]) == []
    args["num_devices"], args["accelerator_config"]["topology"] = 8, "2x4"
    assert placement_causes(payload, ["straddle"]) == []
    llm = {"accelerator_type": "TPU-V6E", "engine_kwargs": {"tensor_parallel_size": 8}}
    payload["applications"]["straddle"]["deployed_app_config"]["args"] = {"llm_configs": [llm]}
    assert "8 per-chip TPU bundles" in placement_causes(payload, ["straddle"])[0]
