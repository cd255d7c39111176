"""Ray Serve LLM on a TPU slice: the LLMConfig validates with Ray's own model, the RayService with the
KubeRay CRD, and carries the official vLLM TPU sample's fields; bad shapes are refused up front."""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import pytest
import yaml
from support.kuberay_crds import sample, schema_errors

from tpuflow.errors import UserInputError
from tpuflow.kuberay.llm_service import llm_rayservice_manifest
from tpuflow.kuberay.manifests import RayClusterTemplate, spec_hash
from tpuflow.labels import SPEC_HASH_ANNOTATION
from tpuflow.serve.config import check_tpu_placement
from tpuflow.serve.llm import (
    DEFAULT_VLLM_TPU_IMAGE,
    LLM_IMPORT_PATH,
    LlmServe,
    llm_config,
    llm_serve_config,
)
from tpuflow.tpu import TpuSlice

SAMPLE = "ray-service.vllm-tpu-v6e-singlehost.yaml"
SHAPES = [("v6e", "2x4", 1, 8), ("v6e", "4x4", 4, 4), ("v5p", "2x2x2", 2, 4), ("v5e", "1x1", 1, 1)]


class Shape(NamedTuple):
    tpu: TpuSlice
    topology: str
    hosts: int
    per_host: int  # TPU chips a host of the slice has


@pytest.fixture(params=SHAPES, ids=["-".join(map(str, s)) for s in SHAPES])
def shape(request: pytest.FixtureRequest) -> Shape:
    """Each slice shape of SHAPES: (accelerator, topology, hosts, chips per host)."""
    accelerator, topology, hosts, per_host = request.param
    return Shape(TpuSlice.from_spec(accelerator, topology), topology, hosts, per_host)


def ray_llm_config() -> Any:
    """Ray's own LLMConfig model; this module needs no vLLM (ray.serve.llm itself imports it)."""
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    assert "vllm" not in sys.modules
    return LLMConfig


def manifest_for(tpu: TpuSlice, llm: LlmServe, **template: Any) -> dict[str, Any]:
    return llm_rayservice_manifest(
        RayClusterTemplate(tpu=tpu, image=DEFAULT_VLLM_TPU_IMAGE, **template), llm, name="vllm-tpu"
    )


def test_llm_config_is_valid_for_ray_and_reserves_exactly_the_slice(shape: Shape) -> None:
    from ray.llm._internal.serve.core.configs.accelerators import TPUAccelerator

    tpu, topology, hosts, per_host = shape
    config = llm_serve_config(tpu, LlmServe("qwen", model_source="Qwen/Qwen2.5-7B-Instruct"))
    (app,) = config["applications"]
    assert app["import_path"] == LLM_IMPORT_PATH
    (raw,) = app["args"]["llm_configs"]
    parsed = ray_llm_config().model_validate(raw)
    assert parsed.accelerator_type == tpu.generation.ray_accelerator_type
    assert (parsed.accelerator_config.kind, parsed.accelerator_config.topology) == ("tpu", topology)
    assert parsed.engine_kwargs["tensor_parallel_size"] == tpu.chips
    assert parsed.deployment_config == {"num_replicas": 1}
    # What Ray Serve LLM will reserve for one replica: one bundle per host of this slice.
    backend = TPUAccelerator(parsed.accelerator_config)
    assert backend.requires_deferred_placement_group
    bundles = backend.default_bundles(num_devices=tpu.chips, accelerator_type_str=parsed.accelerator_type)
    assert len(bundles) == hosts == tpu.num_hosts
    assert {b["TPU"] for b in bundles} == {per_host}


def test_rendered_rayservice_validates_against_the_crd(shape: Shape) -> None:
    tpu, _, hosts, per_host = shape
    manifest = manifest_for(tpu, LlmServe("qwen", cache_bucket="my-xla-cache"))
    assert schema_errors("rayservices", manifest) == []
    group = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (group["numOfHosts"], group["replicas"]) == (hosts, 1)
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["google.com/tpu"] == str(per_host)
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    check_tpu_placement(served, tpu)  # what KubeRay will PUT still declares the topology
    assert manifest["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == spec_hash(manifest["spec"])


def _paths(obj: Any, prefix: str = "") -> set[str]:
    """Every key path; list items keyed by their "name" (or mountPath), so order does not matter."""
    out = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.add(f"{prefix}.{key}")
            out |= _paths(value, f"{prefix}.{key}")
    elif isinstance(obj, list):
        for item in obj:
            tag = item.get("name", item.get("mountPath", "")) if isinstance(item, dict) else ""
            out |= _paths(item, f"{prefix}[{tag}]")
    return out


def test_manifest_carries_the_official_vllm_tpu_samples_fields() -> None:
    official = sample(SAMPLE)
    tpu = TpuSlice.from_spec("v6e", "2x4")  # the sample's shape
    manifest = manifest_for(
        tpu,
        LlmServe("meta-llama/Llama-3.1-8B", cache_bucket="my-bucket"),
        service_account="ksa",
        head_resources={"cpu": "2", "memory": "8G"},
        worker_resources={"cpu": "100", "memory": "200G", "ephemeral-storage": "40G"},
    )
    ours = _paths(manifest["spec"]["rayClusterConfig"])
    # The sample declares a gke-gcsfuse-cache volume it never mounts; everything else must be there.
    missing = sorted(p for p in _paths(official["spec"]["rayClusterConfig"]) - ours if "[gke-gcsfuse-cache]" not in p)
    assert missing == []
    worker = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    official_worker = official["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert worker["template"]["spec"]["nodeSelector"] == official_worker["template"]["spec"]["nodeSelector"]
    assert worker["template"]["metadata"]["annotations"] == official_worker["template"]["metadata"]["annotations"]
    env = {e["name"]: e for e in worker["template"]["spec"]["containers"][0]["env"]}
    official_env = {e["name"]: e for e in official_worker["template"]["spec"]["containers"][0]["env"]}
    assert {k: env[k] for k in official_env} == official_env
    volumes = {v["name"]: v for v in worker["template"]["spec"]["volumes"]}
    official_volumes = {v["name"]: v for v in official_worker["template"]["spec"]["volumes"]}
    want = official_volumes["gcs-fuse-csi-ephemeral"]["csi"]
    assert volumes["gcs-fuse-csi-ephemeral"]["csi"] == {
        **want,
        "volumeAttributes": {**want["volumeAttributes"], "bucketName": "my-bucket"},
    }
    # The sample's app is its own vLLM script; ours is Ray Serve LLM with the slice's placement in it.
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    (cfg,) = app["args"]["llm_configs"]
    assert cfg["engine_kwargs"]["tensor_parallel_size"] == int(
        official["spec"]["serveConfigV2"].split('TPU_CHIPS: "')[1].split('"')[0]
    )
    assert cfg["model_loading_config"] == {"model_id": "meta-llama/Llama-3.1-8B"}


def test_without_a_bucket_the_xla_cache_is_an_empty_dir_and_no_token_is_optional() -> None:
    manifest = manifest_for(TpuSlice.from_spec("v6e", "4x4"), LlmServe("m", hf_secret=None))
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert "annotations" not in head.get("metadata", {})
    assert {"name": "gcs-fuse-csi-ephemeral", "emptyDir": {}} in head["spec"]["volumes"]
    env = [e["name"] for e in head["spec"]["containers"][0]["env"]]
    assert env == ["VLLM_XLA_CACHE_PATH"]  # JAX_PLATFORMS=tpu only on the TPU hosts


def test_deployment_options_and_slices_shape_the_replicas() -> None:
    tpu = TpuSlice.from_spec("v6e", "4x4", num_slices=2)
    cfg = llm_config(tpu, LlmServe("m"))
    assert cfg["deployment_config"] == {"num_replicas": 2}  # one replica per slice
    scaled = llm_serve_config(
        tpu,
        LlmServe(
            "m",
            deployment_options={
                "autoscaling_config": {"min_replicas": 1, "max_replicas": 2},
                "max_ongoing_requests": 32,
                "request_timeout_s": 120,
            },
        ),
    )
    (raw,) = scaled["applications"][0]["args"]["llm_configs"]
    parsed = ray_llm_config().model_validate(raw)  # Ray resolves num_replicas="auto" with the autoscaling config
    assert parsed.deployment_config["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 2}
    assert scaled["http_options"] == {"request_timeout_s": 120}


@pytest.mark.parametrize(
    ("tpu", "llm", "field"),
    [
        # Ray Serve LLM places v6e 2x4 as one 8-chip host: the two-VM form would never schedule.
        (TpuSlice.from_spec("v6e", "2x4", "ct6e-standard-4t"), LlmServe("m"), "machine_type"),
        (
            TpuSlice.from_spec("v6e", "4x4"),
            LlmServe("m", engine_kwargs={"tensor_parallel_size": 8}),
            "engine_kwargs.tensor_parallel_size",
        ),
        (
            TpuSlice.from_spec("v6e", "4x4"),
            LlmServe("m", engine_kwargs={"pipeline_parallel_size": 0}),
            "engine_kwargs.pipeline_parallel_size",
        ),
        (
            TpuSlice.from_spec("v6e", "4x4"),
            LlmServe("m", deployment_options={"num_replicas": 2}),
            "deployment_options.num_replicas",
        ),
        (
            TpuSlice.from_spec("v6e", "4x4", num_slices=2),
            LlmServe("m", deployment_options={"autoscaling_config": {"max_replicas": 3}}),
            "deployment_options.autoscaling_config",
        ),
        (
            TpuSlice.from_spec("v6e", "4x4"),
            LlmServe("m", deployment_options={"user_config": {"max_inflight_requests": 4}}),
            "deployment_options.user_config",
        ),
        (TpuSlice.from_spec("v6e", "4x4"), LlmServe("bad model id"), "llm_model_id"),
        (TpuSlice.from_spec("v6e", "4x4"), LlmServe("m", max_model_len=0), "max_model_len"),
        (TpuSlice.from_spec("v6e", "2x8"), LlmServe("m"), "topology"),  # Ray 2.60 has it, GKE does not
    ],
)
def test_bad_llm_input_names_the_field(tpu: TpuSlice, llm: LlmServe, field: str) -> None:
    with pytest.raises(UserInputError) as err:
        llm_serve_config(tpu, llm)
    assert err.value.field == field


def test_bad_bucket_and_unknown_options_are_refused() -> None:
    with pytest.raises(UserInputError) as err:
        manifest_for(TpuSlice.from_spec("v6e", "4x4"), LlmServe("m", cache_bucket="gs://bucket"))
    assert err.value.field == "cache_bucket"
    with pytest.raises(UserInputError) as err:
        LlmServe.from_value("m", {"max_len": 10})
    assert err.value.field == "llm_options"


# --- the RayService deploy operator's llm_model_id --------------------------------------------------


def test_deploy_operator_builds_the_llm_rayservice_at_parse_time() -> None:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator
    from tpuflow.labels import CLUSTER_SPEC_HASH_ANNOTATION

    tpu = TpuSlice.from_spec("v6e", "4x4")
    op = KubeRayDeployServiceOperator(
        task_id="serve_llm",
        tpu_slice=tpu,
        image="vllm/vllm-tpu:v0.11.1",
        llm_model_id="Qwen/Qwen2.5-7B-Instruct",
        llm_options={"max_model_len": 8192, "cache_bucket": "xla-cache"},
        deployment_options={"max_ongoing_requests": 16},
    )
    manifest = op.build_manifest_for("llm", "default", {})
    assert schema_errors("rayservices", manifest) == []
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    (cfg,) = app["args"]["llm_configs"]
    assert cfg["accelerator_config"] == {"kind": "tpu", "topology": "4x4"}
    assert cfg["engine_kwargs"] == {"tensor_parallel_size": 16, "max_model_len": 8192}
    assert cfg["deployment_config"] == {"max_ongoing_requests": 16, "num_replicas": 1}
    annotations = manifest["metadata"]["annotations"]
    assert annotations[SPEC_HASH_ANNOTATION] == spec_hash(manifest["spec"])
    assert annotations[CLUSTER_SPEC_HASH_ANNOTATION] == spec_hash(manifest["spec"]["rayClusterConfig"])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"llm_model_id": "m"}, "image"),
        ({"llm_model_id": "m", "image": "i:1", "serve_config": {"applications": []}}, "serve_config"),
        ({}, "serve_config"),
        (
            {"serve_config": {"applications": [{"name": "a", "import_path": "m:app"}]}, "llm_options": {}},
            "llm_options",
        ),
        ({"llm_model_id": "m", "image": "i:1", "deployment_options": {"num_replica": 1}}, "deployment_options"),
    ],
)
def test_deploy_operator_refuses_bad_llm_arguments_at_parse_time(kwargs: dict[str, Any], field: str) -> None:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator

    with pytest.raises(UserInputError) as err:
        KubeRayDeployServiceOperator(task_id="t", tpu_slice=TpuSlice.from_spec("v6e", "4x4"), **kwargs)
    assert err.value.field == field


def test_templated_model_is_checked_when_the_task_runs() -> None:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator

    op = KubeRayDeployServiceOperator(
        task_id="t", tpu_slice={"accelerator": "v6e", "topology": "4x4"}, image="i:1", llm_model_id="{{ params.model }}"
    )
    op.llm_model_id = "bad model"  # what rendering might produce
    with pytest.raises(UserInputError) as err:
        op.validate_arguments()
    assert err.value.field == "llm_model_id"
