"""The RayService deploy places a multi-host app on its slice: what the app's args leave out is derived
from the slice (logged when the task runs), what they declare is kept, and a contradiction is refused in
one line when the DAG is parsed. No Kubernetes: the manifest the task would send is built directly."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from support.airflow_context import task_context

from tpuflow.errors import UserInputError
from tpuflow.kuberay.operators import KubeRayDeployServiceOperator
from tpuflow.serve.config import serve_tpu_args
from tpuflow.tpu import TpuSlice

IMAGE = "rayproject/ray:2.60.0-py311"
TWO_HOST_2X4 = TpuSlice.from_spec("v6e", "2x4", "ct6e-standard-4t")


def service(serve_config: dict[str, Any], **kw: Any) -> KubeRayDeployServiceOperator:
    return KubeRayDeployServiceOperator(
        task_id="serve", kubernetes_conn_id="k", image=IMAGE, serve_config=serve_config, **kw
    )


def apps_sent(op: KubeRayDeployServiceOperator) -> list[dict[str, Any]]:
    body = op.build_body(task_context(task_id="serve"), "default")
    return yaml.safe_load(body["spec"]["serveConfigV2"])["applications"]


def chat(**args: Any) -> dict[str, Any]:
    return {"applications": [{"name": "chat", "import_path": "acme_chat.app:build_app", "args": args}]}


def test_the_rayservice_of_a_multi_host_app_carries_the_slices_placement(capfd: pytest.CaptureFixture[str]) -> None:
    given = chat(model_dir="gs://acme/chat")
    before = copy.deepcopy(given)
    op = service(given, tpu_slice=TWO_HOST_2X4)  # was refused: "must declare ... accelerator_config"
    capfd.readouterr()  # the parse-time check logs nothing
    (app,) = apps_sent(op)
    assert app["args"] == {"model_dir": "gs://acme/chat", **serve_tpu_args(TWO_HOST_2X4)}
    assert app["args"]["accelerator_config"] == {"kind": "tpu", "topology": "2x4"}
    assert op.serve_config == before
    lines = [line for line in capfd.readouterr().out.splitlines() if "derived" in line]
    assert len(lines) == 1 and "accelerator_config.topology=2x4" in lines[0], lines
    assert "for app chat from the v6e 2x4 slice" in lines[0]


def test_an_inline_llm_config_gets_only_its_own_placement_fields() -> None:
    llm = {"model_loading_config": {"model_id": "acme/chat-7b"}, "accelerator_config": {"kind": "tpu"}}
    config = {"applications": [{"name": "llm", "import_path": "ray.serve.llm:build_openai_app",
                                "args": {"llm_configs": [llm]}}]}  # fmt: skip
    (app,) = apps_sent(service(config, tpu_slice={"accelerator": "v6e", "topology": "4x4"}))
    (placed,) = app["args"]["llm_configs"]
    assert placed == {**llm, "accelerator_type": "TPU-V6E", "accelerator_config": {"kind": "tpu", "topology": "4x4"}}


def test_a_declared_placement_is_sent_as_given() -> None:
    declared = chat(**serve_tpu_args(TWO_HOST_2X4))
    assert apps_sent(service(declared, tpu_slice=TWO_HOST_2X4)) == declared["applications"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (
            {"accelerator_config": {"kind": "tpu", "topology": "4x4"}},
            "applications[chat].args.accelerator_config.topology",
        ),
        ({"accelerator_type": "TPU-V5P"}, "applications[chat].args.accelerator_type"),
    ],
)
def test_a_declared_value_the_slice_contradicts_is_refused_at_parse_time(args: dict[str, Any], field: str) -> None:
    with pytest.raises(UserInputError) as err:
        service(chat(**args), tpu_slice=TWO_HOST_2X4)
    assert err.value.field == field and "\n" not in str(err.value) and "v6e 2x4" in str(err.value)
