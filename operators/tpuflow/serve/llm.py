"""Ray Serve LLM (vLLM) on a TPU slice: the serve config and the pods' vLLM fields, derived from the TpuSlice
(tpuflow.kuberay.llm_service.llm_rayservice_manifest wraps them in a RayService).

    tpu = TpuSlice.from_spec("v6e", "4x4")
    config = llm_serve_config(tpu, LlmServe("qwen", model_source="Qwen/Qwen2.5-7B-Instruct"))

The application is `ray.serve.llm:build_openai_app` with one LLMConfig: `accelerator_type` and
`accelerator_config {kind: tpu, topology}` from the slice (Serve then skips its up-front placement
group and each replica reserves one whole slice with slice_placement_group, so a tensor-parallel model
never straddles two slices), `engine_kwargs.tensor_parallel_size` = the slice's chips, one replica per
slice. The pods carry what KubeRay's official `ray-service.vllm-tpu-v6e-singlehost.yaml` sample
sets for vLLM: the Hugging Face token from a Secret, VLLM_XLA_CACHE_PATH on a /data volume (GCS FUSE
when a bucket is given, so compiled XLA graphs survive restarts), JAX_PLATFORMS=tpu on the TPU hosts.
Everything here is plain data: no Ray or vLLM import.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuflow.errors import UserInputError
from tpuflow.serve.config import check_tpu_placement, serve_application, serve_config
from tpuflow.serve.deployment_options import DeploymentOptions
from tpuflow.tpu import TpuSlice

# The vLLM TPU image (vLLM's "Installation with TPU": Docker Hub vllm/vllm-tpu); pin a tag in production.
DEFAULT_VLLM_TPU_IMAGE = "vllm/vllm-tpu:latest"
LLM_APP = "llm"
LLM_IMPORT_PATH = "ray.serve.llm:build_openai_app"
DEFAULT_MAX_MODEL_LEN = 4096
XLA_CACHE_PATH = "/data"
CACHE_VOLUME = "gcs-fuse-csi-ephemeral"
# As in KubeRay's vLLM TPU sample: the GCS FUSE sidecar unlimited, a parallel-download file cache.
GCSFUSE_ANNOTATIONS = {
    "gke-gcsfuse/volumes": "true",
    "gke-gcsfuse/cpu-limit": "0",
    "gke-gcsfuse/memory-limit": "0",
    "gke-gcsfuse/ephemeral-storage-limit": "0",
}
GCSFUSE_MOUNT_OPTIONS = (
    "implicit-dirs,file-cache:enable-parallel-downloads:true,file-cache:parallel-downloads-per-file:100,"
    "file-cache:max-parallel-downloads:-1,file-cache:download-chunk-size-mb:10,file-cache:max-size-mb:-1"
)
# Ray 2.60's Serve LLM computes one bundle per host from the topology with its own chips-per-host rule
# (ray._private.accelerators.tpu.get_chips_per_host): 8 for a v5e/v6e slice of up to 8 chips, else 4.
_RAY_SINGLE_HOST_MAX = {"TPU-V5LITEPOD": 8, "TPU-V6E": 8}
_ENGINE_SLICE_KEYS = ("tensor_parallel_size", "pipeline_parallel_size")
_MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_SECRET_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")


@dataclass(frozen=True)
class LlmServe:
    """What to serve with Ray Serve LLM.

    :param model_id: the name clients send as "model" (and the Hugging Face id unless model_source is given).
    :param model_source: Hugging Face id, or gs:// / local path of the weights (default: model_id).
    :param max_model_len: vLLM's context length (prompt + completion tokens).
    :param engine_kwargs: more vLLM engine arguments (dtype, tokenizer_mode, ...); tensor_parallel_size
        (x pipeline_parallel_size) must equal the slice's chips, which is also the default.
    :param deployment_options: replicas/autoscaling and request settings (default: one replica per slice).
    :param route_prefix: where the OpenAI routes live (/v1/... below it).
    :param hf_secret: Kubernetes Secret with the Hugging Face token ("NAME" or "NAME:KEY"; None: no token).
    :param cache_bucket: GCS bucket mounted at /data with GCS FUSE for the XLA cache (None: an emptyDir).
    """

    model_id: str
    model_source: str | None = None
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    deployment_options: DeploymentOptions | Mapping[str, Any] | None = None
    route_prefix: str = "/"
    hf_secret: str | None = "hf-secret:hf_api_token"
    cache_bucket: str | None = None

    @classmethod
    def from_value(cls, model_id: str, options: Mapping[str, Any] | None = None) -> LlmServe:
        """An operator's llm_model_id plus its llm_options dict (field names of this class)."""
        options = dict(options or {})
        known = set(cls.__dataclass_fields__) - {"model_id"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise UserInputError("llm_options", unknown, f"unknown option(s); known: {', '.join(sorted(known))}")
        return cls(model_id=model_id, **options)

    def hf_secret_ref(self) -> tuple[str, str] | None:
        if not self.hf_secret:
            return None
        name, _, key = str(self.hf_secret).partition(":")
        key = key or "hf_api_token"
        if not (_SECRET_NAME_RE.match(name) and len(name) <= 253 and _SECRET_KEY_RE.match(key)):
            raise UserInputError(
                "hf_secret",
                self.hf_secret,
                'give the Secret as NAME or NAME:KEY, e.g. "hf-secret:hf_api_token" (NAME: lowercase letters, '
                "digits, '-' and '.'; KEY: letters, digits, '-', '_' and '.')",
            )
        return name, key

    def options(self) -> DeploymentOptions:
        return DeploymentOptions.from_value(self.deployment_options)


def check_llm_slice(tpu: TpuSlice) -> TpuSlice:
    """A slice Ray Serve LLM places correctly: Ray's topology, and Ray's idea of chips per host."""
    tpu.require(gke=True, ray=True)
    ray_max = _RAY_SINGLE_HOST_MAX.get(tpu.generation.ray_accelerator_type, 4)
    ray_per_host = tpu.chips if tpu.chips <= ray_max else 4
    if ray_per_host != tpu.chips_per_host:
        raise UserInputError(
            "machine_type",
            tpu.machine_type,
            f"Ray Serve LLM places a {tpu.generation.name} {tpu.topology} slice as {tpu.chips // ray_per_host} "
            f"host(s) of {ray_per_host} chips; use {tpu.generation.machine_type(ray_per_host)}",
        )
    return tpu


def llm_config(tpu: TpuSlice, llm: LlmServe) -> dict[str, Any]:
    """One LLMConfig (ray.serve.llm) as the plain dict a Serve config carries."""
    check_llm_slice(tpu)
    if not isinstance(llm.model_id, str) or not _MODEL_ID_RE.match(llm.model_id):
        raise UserInputError("llm_model_id", llm.model_id, "give the model's name, e.g. Qwen/Qwen2.5-7B-Instruct")
    if isinstance(llm.max_model_len, bool) or not isinstance(llm.max_model_len, int) or llm.max_model_len < 16:
        raise UserInputError("max_model_len", llm.max_model_len, "give vLLM's context length in tokens, e.g. 4096")
    if not isinstance(llm.engine_kwargs, Mapping):
        raise UserInputError("engine_kwargs", llm.engine_kwargs, "give a dict of vLLM engine arguments")
    engine: dict[str, Any] = {"tensor_parallel_size": tpu.chips, "max_model_len": llm.max_model_len}
    engine.update(llm.engine_kwargs)
    devices = 1
    for key in _ENGINE_SLICE_KEYS:
        value = engine.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserInputError(f"engine_kwargs.{key}", value, "give a whole number >= 1")
        devices *= value
    if devices != tpu.chips:
        raise UserInputError(
            "engine_kwargs.tensor_parallel_size",
            engine["tensor_parallel_size"],
            f"each replica reserves one whole {tpu.topology} slice: tensor_parallel_size x pipeline_parallel_size "
            f"must be its {tpu.chips} chips",
        )
    options = llm.options()
    deployment = options.llm_deployment_config()
    replicas = deployment.get("num_replicas")
    most = (options.autoscaling_config or {}).get("max_replicas", replicas if isinstance(replicas, int) else 1)
    if most > tpu.num_slices:
        raise UserInputError(
            "deployment_options.num_replicas" if isinstance(replicas, int) else "deployment_options.autoscaling_config",
            most,
            f"each replica needs a whole slice and the cluster has {tpu.num_slices}; lower it or raise num_slices",
        )
    deployment.setdefault("num_replicas", tpu.num_slices)
    loading: dict[str, Any] = {"model_id": llm.model_id}
    if llm.model_source:
        loading["model_source"] = llm.model_source
    return {
        "model_loading_config": loading,
        **tpu.serve_accelerator_config(),
        "engine_kwargs": engine,
        "deployment_config": deployment,
        "runtime_env": {"env_vars": {"VLLM_XLA_CACHE_PATH": XLA_CACHE_PATH}},
    }


def llm_serve_config(tpu: TpuSlice, llm: LlmServe, *, http_port: int | None = None) -> dict[str, Any]:
    """The Serve config (REST / serveConfigV2 shape) of one Ray Serve LLM application on `tpu`."""
    app = serve_application(
        LLM_APP, LLM_IMPORT_PATH, route_prefix=llm.route_prefix, args={"llm_configs": [llm_config(tpu, llm)]}
    )
    config = serve_config([app], http_port=http_port)
    http = llm.options().http_options()
    if http:
        config["http_options"] = {**config.get("http_options", {}), **http}
    check_tpu_placement(config, tpu)
    return config


def _add_env(container: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    env = container.setdefault("env", [])
    have = {e["name"] for e in env}
    env.extend(copy.deepcopy(e) for e in entries if e["name"] not in have)  # what the user set wins


def add_vllm_pod_fields(cluster_spec: dict[str, Any], llm: LlmServe) -> dict[str, Any]:
    """The official vLLM TPU sample's pod fields on a RayService's rayClusterConfig (head and TPU group)."""
    if llm.cache_bucket is not None and not _BUCKET_RE.match(str(llm.cache_bucket)):
        raise UserInputError("cache_bucket", llm.cache_bucket, "give a GCS bucket name (no gs://), e.g. my-xla-cache")
    secret = llm.hf_secret_ref()
    common: list[dict[str, Any]] = [{"name": "VLLM_XLA_CACHE_PATH", "value": XLA_CACHE_PATH}]
    if secret:
        ref = {"secretKeyRef": {"name": secret[0], "key": secret[1]}}
        common.insert(0, {"name": "HUGGING_FACE_HUB_TOKEN", "valueFrom": ref})
    if llm.cache_bucket:
        volume: dict[str, Any] = {
            "name": CACHE_VOLUME,
            "csi": {
                "driver": "gcsfuse.csi.storage.gke.io",
                "volumeAttributes": {"bucketName": llm.cache_bucket, "mountOptions": GCSFUSE_MOUNT_OPTIONS},
            },
        }
    else:
        volume = {"name": CACHE_VOLUME, "emptyDir": {}}
    groups = [(cluster_spec["headGroupSpec"], False)] + [(g, True) for g in cluster_spec["workerGroupSpecs"]]
    for group, is_tpu in groups:
        template = group["template"]
        if llm.cache_bucket:
            meta = template.setdefault("metadata", {})
            meta["annotations"] = {**GCSFUSE_ANNOTATIONS, **(meta.get("annotations") or {})}
        pod = template["spec"]
        pod.setdefault("volumes", []).append(copy.deepcopy(volume))
        for container in pod["containers"]:
            extra = [{"name": "JAX_PLATFORMS", "value": "tpu"}] if is_tpu else []
            _add_env(container, [*extra, *common])
            container.setdefault("volumeMounts", []).append({"name": CACHE_VOLUME, "mountPath": XLA_CACHE_PATH})
    return cluster_spec
