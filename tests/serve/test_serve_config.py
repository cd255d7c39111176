"""One Serve config for both backends; a multi-host model without a topology is refused up front."""

from __future__ import annotations

import pytest
from tpuflow.errors import UserInputError
from tpuflow.serve.config import check_tpu_placement, serve_application, serve_config
from tpuflow.serve.status import judge
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
