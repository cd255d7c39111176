"""`tpuflow render raycluster|rayservice` print CRD-valid manifests for a slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.kuberay_crds import schema_errors

from tpuflow.cli import main
from tpuflow.kubernetes.ownership import resource_name


def render(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["render", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("accelerator", "topology", "hosts"), [("v6e", "4x4", 4), ("v5e", "2x2", 1), ("tpu7x", "2x2x2", 2)]
)
def test_render_raycluster_prints_a_valid_manifest(
    capsys: pytest.CaptureFixture[str], accelerator: str, topology: str, hosts: int
) -> None:
    rc, out, _ = render(
        capsys,
        "raycluster",
        "--accelerator",
        accelerator,
        "--topology",
        topology,
        "--env",
        "JAX_PLATFORMS=tpu",
        "--worker-cpu",
        "24",
        "--worker-memory",
        "200G",
    )
    assert rc == 0
    manifest = yaml.safe_load(out)
    assert schema_errors("rayclusters", manifest) == []
    group = manifest["spec"]["workerGroupSpecs"][0]
    assert group["numOfHosts"] == hosts
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "24"


def test_render_rayservice_from_a_serve_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A multi-host slice: placement fully declared (tpuflow.serve.config.place_on_slice adds nothing).
    args = {
        "accelerator_type": "TPU-V6E",
        "accelerator_config": {"kind": "tpu", "topology": "4x4"},
        "chips_per_host": 4,
    }
    config = {
        "applications": [{"name": "llm", "import_path": "workloads.serve:app", "route_prefix": "/v1", "args": args}]
    }
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(config))
    rc, out, _ = render(
        capsys,
        "rayservice",
        "--accelerator",
        "TPU-V6E",
        "--topology",
        "4x4",
        "--serve-config",
        str(path),
        "--dag-id",
        "tpu_llm_pipeline_gke",
        "--run-id",
        "manual__1",
        "--task-id",
        "serve",
    )
    assert rc == 0
    assert "serveConfigV2: |\n" in out  # a literal block, as in the KubeRay samples
    manifest = yaml.safe_load(out)
    assert schema_errors("rayservices", manifest) == []
    assert manifest["metadata"]["name"] == resource_name("tpu_llm_pipeline_gke", "manual__1", "serve")
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tpuflow"
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"] == config["applications"]


def test_render_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = render(
        capsys, "rayservice", "--accelerator", "v5e", "--topology", "2x2", "--import-path", "m:app", "--json"
    )
    assert rc == 0 and json.loads(out)["kind"] == "RayService"


def test_render_rayservice_llm_serves_the_model_on_the_slice(capsys: pytest.CaptureFixture[str]) -> None:
    command = (
        "rayservice --accelerator v6e --topology 4x4 --llm Qwen/Qwen2.5-7B-Instruct --max-model-len 8192"
        " --engine-kwarg dtype=bfloat16 --engine-kwarg enable_prefix_caching=true --cache-bucket xla-cache"
        " --max-ongoing-requests 32 --request-timeout 300"
    )
    rc, out, _ = render(capsys, *command.split())
    assert rc == 0
    assert "&id" not in out  # head and workers get their own copies, no YAML aliases
    manifest = yaml.safe_load(out)
    assert schema_errors("rayservices", manifest) == []
    spec = manifest["spec"]["rayClusterConfig"]
    assert spec["workerGroupSpecs"][0]["numOfHosts"] == 4
    assert spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"].startswith("vllm/vllm-tpu:")
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    assert served["http_options"]["request_timeout_s"] == 300
    (app,) = served["applications"]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    (cfg,) = app["args"]["llm_configs"]
    assert cfg["accelerator_type"] == "TPU-V6E" and cfg["accelerator_config"] == {"kind": "tpu", "topology": "4x4"}
    assert cfg["engine_kwargs"] == {
        "tensor_parallel_size": 16,
        "max_model_len": 8192,
        "dtype": "bfloat16",
        "enable_prefix_caching": True,
    }
    assert cfg["deployment_config"] == {"max_ongoing_requests": 32, "num_replicas": 1}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["rayservice", "--accelerator", "v6e", "--topology", "4x4", "--llm", "m", "--import-path", "a:b"], "--llm"),
        (
            "rayservice --accelerator v6e --topology 2x4 --machine-type ct6e-standard-4t --llm m".split(),
            "ct6e-standard-8t",
        ),
        ("rayservice --accelerator v6e --topology 4x4 --llm m --num-replicas 2".split(), "num_replicas"),
        (
            "rayservice --accelerator v6e --topology 4x4 --llm m --engine-kwarg tensor_parallel_size=4".split(),
            "16 chips",
        ),
        (["raycluster", "--accelerator", "v6e", "--topology", "16"], "topology='16'"),
        (["raycluster", "--accelerator", "tpu-v5e", "--topology", "2x2"], "TPU-V5LITEPOD"),
        (["raycluster", "--accelerator", "v6e", "--topology", "4x4", "--env", "NOEQUALS"], "--env"),
        (["rayservice", "--accelerator", "v6e", "--topology", "4x4"], "--import-path"),
        (["raycluster", "--accelerator", "v6e", "--topology", "4x4", "--name", "Not_DNS"], "name="),
    ],
)
def test_render_rejects_bad_input_naming_the_field(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    rc, out, err = render(capsys, *argv)
    assert rc == 2 and out == ""
    assert needle in err
