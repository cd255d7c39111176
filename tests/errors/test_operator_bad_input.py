"""Operators given a bad argument: UserInputError naming the argument (never AttributeError/TypeError).

Static values fail when the DAG file is parsed (the constructor); templated ones once rendered, at the
start of execute, before any hook or client is made. The table is one row per (operator, argument, bad
value): wrong types (an int topology, a list accelerator, a bool count), non-finite and negative times,
training options the Ray driver would only reject on the cluster, and static names next to a templated
slice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from tpuflow.errors import UserInputError

TEMPLATE = "{{ ti.xcom_pull(task_ids='check_params')['topology'] }}"
CLUSTER_INFO = {"dashboard_url": "http://127.0.0.1:8265", "serve_url": "http://127.0.0.1:8000", "backend": "local"}
IMAGE = "rayproject/ray:2.60.0-py311"
V6E_4X4 = {"accelerator": "v6e", "topology": "4x4"}
V6E_2X2 = {"accelerator": "v6e", "topology": "2x2"}


def gke_create(**kw: Any) -> Any:
    from tpuflow.gke.operators import GKECreateTPUNodePoolOperator

    args = {"project_id": "my-proj", "location": "us-east5-b", "cluster_name": "c1", "tpu_slice": V6E_4X4}
    return GKECreateTPUNodePoolOperator(task_id="pool", **{**args, **kw})


def gke_delete(**kw: Any) -> Any:
    from tpuflow.gke.operators import GKEDeleteNodePoolOperator

    args = {"project_id": "my-proj", "location": "us-east5-b", "cluster_name": "c1", "node_pool_name": "p1"}
    return GKEDeleteNodePoolOperator(task_id="del", **{**args, **kw})


def local_start(**kw: Any) -> Any:
    from tpuflow.local.operators import LocalRayCreateClusterOperator

    args = {"tpu_slice": {"accelerator": "v6e", "topology": "2x2"}}
    return LocalRayCreateClusterOperator(task_id="start", **{**args, **kw})


def raycluster(**kw: Any) -> Any:
    from tpuflow.kuberay.operators import KubeRayCreateClusterOperator

    args = {"kubernetes_conn_id": "k", "tpu_slice": V6E_4X4, "image": IMAGE}
    return KubeRayCreateClusterOperator(task_id="rc", **{**args, **kw})


def raycluster_manifest(**kw: Any) -> Any:
    from tpuflow.kuberay.operators import KubeRayCreateClusterOperator

    return KubeRayCreateClusterOperator(task_id="rcm", kubernetes_conn_id="k", **kw)


def llm_service(**kw: Any) -> Any:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator

    args = {"kubernetes_conn_id": "k", "tpu_slice": V6E_2X2, "image": "vllm/vllm-tpu:v0.11.1"}
    return KubeRayDeployServiceOperator(task_id="llm", llm_model_id="Qwen/Qwen2.5-0.5B", **{**args, **kw})


def raycluster_delete(**kw: Any) -> Any:
    from tpuflow.kuberay.operators import KubeRayDeleteClusterOperator

    return KubeRayDeleteClusterOperator(task_id="rcd", **{"kubernetes_conn_id": "k", "name": "rc1", **kw})


def rayservice(**kw: Any) -> Any:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator

    config = {"applications": [{"name": "a", "import_path": "addition.serve_app:app_builder", "route_prefix": "/"}]}
    args = {"kubernetes_conn_id": "k", "tpu_slice": V6E_2X2, "image": IMAGE, "serve_config": config}
    return KubeRayDeployServiceOperator(task_id="rs", **{**args, **kw})


def ray_job(**kw: Any) -> Any:
    from tpuflow.rayjob.operators import RaySubmitJobOperator

    return RaySubmitJobOperator(task_id="job", **{"entrypoint": "python -m x", "cluster": CLUSTER_INFO, **kw})


def ray_train(**kw: Any) -> Any:
    from tpuflow.rayjob.workload_operators import RayTrainOperator

    args = {
        "framework": "jax",
        "train_loop": "addition.train_jax:train_loop_per_worker",
        "tpu_slice": {"accelerator": "v6e", "topology": "2x2"},
        "storage_path": "/tmp/ckpt",
        "run_name": "r",
        "cluster": CLUSTER_INFO,
    }
    return RayTrainOperator(task_id="train", **{**args, **kw})


def serve_deploy(**kw: Any) -> Any:
    from tpuflow.serve.operators import RayServeDeployOperator

    config = {"applications": [{"name": "a", "import_path": "m:app", "route_prefix": "/"}]}
    return RayServeDeployOperator(task_id="deploy", **{"serve_config": config, "cluster": CLUSTER_INFO, **kw})


def smoke(**kw: Any) -> Any:
    from tpuflow.serve.operators import ServeEndpointSmokeTestOperator

    args = {"url": "http://127.0.0.1:8000/a", "payload": {"prompt": "1+1="}, "expect": "2"}
    return ServeEndpointSmokeTestOperator(task_id="smoke", **{**args, **kw})


def acquire(**kw: Any) -> Any:
    from tpuflow.slices.operators import TPUAcquireSliceOperator

    return TPUAcquireSliceOperator(task_id="lease", **kw)


# (operator factory, argument, bad value, text the fix must hold)
PARSE_TIME: list[tuple[Callable[..., Any], str, Any, str]] = [
    # wrong types where the slice catalog expects strings
    (gke_create, "tpu_slice", {**V6E_4X4, "topology": 16}, "not a chip count"),
    (gke_create, "tpu_slice", {**V6E_4X4, "accelerator": ["v6e"]}, "as a string"),
    (gke_create, "tpu_slice", {**V6E_4X4, "machine_type": 4}, "give a string"),
    (gke_create, "tpu_slice", {**V6E_4X4, "num_slices": True}, "whole number"),
    (local_start, "tpu_slice", {"accelerator": "v6e", "topology": 4}, "not a chip count"),
    (local_start, "tpu_slice", {"accelerator": {"v6e": 1}, "topology": "2x2"}, "as a string"),
    (raycluster, "tpu_slice", {**V6E_4X4, "topology": 2.5}, "as a string"),
    (ray_train, "tpu_slice", {"accelerator": "v6e", "topology": 16}, "not a chip count"),
    (ray_train, "tpu_slice", {"accelerator": "v6e", "topologyy": "2x2"}, "takes only"),
    (ray_train, "tpu_slice", {"accelerator": None, "topology": "2x2"}, "give a TpuSlice"),
    # times: negative, zero, non-finite, a bool, text
    (gke_create, "poll_interval", -1, "> 0"),
    (gke_create, "retry_backoff", math.nan, "> 0"),
    (gke_create, "max_backoff", math.inf, "> 0"),
    (gke_create, "expires_after", timedelta(hours=-1), "> 0"),
    (gke_create, "expires_after", math.nan, "> 0"),
    (local_start, "expires_after", -1, "None for no limit"),
    (raycluster, "expires_after", math.nan, "None for no limit"),
    (rayservice, "expires_after", timedelta(hours=-1), "None for no limit"),
    (gke_create, "max_busy_retries", 2.5, "whole number"),
    (gke_create, "stockout_retries", -1, ">= 0"),
    (gke_delete, "poll_interval", "10", "> 0"),
    (local_start, "start_timeout", math.inf, "> 0"),
    (local_start, "host_cpus", 0, ">= 1"),
    (raycluster, "wait_timeout", math.nan, "> 0"),
    (raycluster, "poll_interval", True, "> 0"),
    (raycluster, "log_lines", -5, ">= 0"),
    (raycluster_delete, "wait_timeout", -1, "> 0"),
    (ray_job, "poll_interval", 0, "> 0"),
    (ray_job, "job_timeout", -60, "None for no limit"),
    (ray_job, "job_timeout", math.inf, "None for no limit"),
    (ray_job, "entrypoint_num_cpus", -1, ">= 0"),
    (ray_job, "entrypoint", "  ", "argument list"),
    (ray_job, "entrypoint", [], "argument list"),
    (ray_job, "entrypoint", ["python", "-m", "x", None], "a string or a number"),
    (ray_job, "entrypoint", ["python", {"a": 1}], "a string or a number"),
    (ray_job, "min_result", {"accuracy": math.nan}, "finite"),
    (serve_deploy, "deploy_timeout", -1, "> 0"),
    (serve_deploy, "poll_interval", math.nan, "> 0"),
    (smoke, "timeout", 0, "> 0"),
    (acquire, "poll_interval", -5, "> 0"),
    (acquire, "wait_timeout", math.nan, "None for no limit"),
    # a number no train loop can use (the options themselves are the workload's: its check_params)
    (ray_train, "train_loop_config", {"learning_rate": math.nan}, "finite"),
    (ray_train, "max_failures", -2, "-1: no limit"),
    (ray_train, "checkpoint_num_to_keep", 0, ">= 1"),
    (ray_train, "worker_env", ["A=1"], "give a dict"),
    # files and configs a user hands over: a manifest, a Serve config, deployment options
    (raycluster_manifest, "manifest", "kind: RayCluster\nspec: [unclosed\n", "not valid YAML"),
    (raycluster_manifest, "manifest", ["a", "list"], "ray.io/v1 RayCluster"),
    (raycluster_manifest, "manifest", {"apiVersion": "v1", "kind": "Pod"}, "ray.io/v1 RayCluster"),
    (raycluster_manifest, "manifest", {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {}}, "headGroupSpec"),
    (rayservice, "serve_config", "applications: [name: x\n  - : :\n", "not valid YAML"),
    (rayservice, "serve_config", {"applications": [{"name": "a", "import_path": 5}]}, "module.sub:app"),
    # a replica asking for more TPU than a host has would never place (a multi-host slice's placement is
    # derived for an app that leaves it out: tests/kuberay/test_deploy_service_placement.py)
    (
        rayservice,
        "serve_config",
        {
            "applications": [
                {"name": "a", "import_path": "m:app", "args": {"accelerator_type": "TPU-V6E", "chips_per_host": 8}}
            ]
        },
        "has 4 TPU",
    ),
    (llm_service, "deployment_options", {"num_replicas": 0}, ">= 1"),
    (llm_service, "deployment_options", {"request_timeout_s": math.nan}, "finite number of seconds"),
    (
        llm_service,
        "deployment_options",
        {"autoscaling_config": {"max_replicas": 2, "target_ongoing_requests": math.inf}},
        "positive",
    ),
    (llm_service, "llm_options", {"max_model_lenn": 4096}, "unknown option"),
    (llm_service, "llm_options", {"hf_secret": "HF Token"}, "NAME:KEY"),
    # names
    (raycluster, "namespace", "Bad_NS", "RFC 1123"),
    (raycluster_delete, "name", "Bad_Name", "RFC 1035"),
    (raycluster_delete, "namespace", 7, "RFC 1123"),
]

# Static names next to a templated slice: still checked at parse time (before an earlier task makes a pool).
STATIC_NAMES: list[tuple[str, Any]] = [
    ("project_id", "Not A Project"),
    ("location", "mars-1"),
    ("cluster_name", "Cluster_1"),
    ("node_pool_name", "Pool_1"),
]


@pytest.mark.parametrize(
    ("factory", "field", "value", "fix"),
    PARSE_TIME,
    ids=[f"{f.__name__}-{a}-{v!r}"[:60] for f, a, v, _ in PARSE_TIME],
)
def test_bad_static_argument_fails_at_parse_time(factory: Callable[..., Any], field: str, value: Any, fix: str) -> None:
    with pytest.raises(UserInputError) as err:
        factory(**{field: value})
    # the argument, or the option inside it (llm_options' hf_secret), or the Serve application
    names = {field, "applications", *(value if isinstance(value, dict) else ())}
    assert err.value.field.split("[")[0].split(".")[0] in names, str(err.value)
    assert len(str(err.value)) < 600
    assert fix in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("field", "value"), STATIC_NAMES, ids=[f for f, _ in STATIC_NAMES])
def test_static_names_checked_when_the_slice_is_templated(field: str, value: Any) -> None:
    with pytest.raises(UserInputError) as err:
        gke_create(tpu_slice={**V6E_4X4, "topology": TEMPLATE}, **{field: value})
    assert err.value.field == field
    assert repr(value) in str(err.value)


def test_templated_slice_with_good_names_still_parses() -> None:
    op = gke_create(tpu_slice={**V6E_4X4, "topology": TEMPLATE}, node_pool_name="pool-1")
    assert op.tpu_slice == {**V6E_4X4, "topology": TEMPLATE}


def test_rendered_values_are_checked_before_any_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """A templated value that renders to a bad one fails at the start of execute, naming the argument."""
    op = ray_train(tpu_slice={"accelerator": "v6e", "topology": TEMPLATE}, train_loop_config="{{ params.cfg }}")
    op.tpu_slice = {"accelerator": "v6e", "topology": 16}  # what rendering produced (a native-typed render)
    op.train_loop_config = {"num_steps": math.inf}

    def no_hook(*_: Any, **__: Any) -> Any:
        raise AssertionError("a hook was made before the arguments were checked")

    monkeypatch.setattr(type(op), "hook", no_hook)
    with pytest.raises(UserInputError, match=r"tpu_slice\.topology='16' is invalid"):
        op.validate_arguments()
    op.tpu_slice = {"accelerator": "v6e", "topology": "2x2"}
    with pytest.raises(UserInputError, match=r"train_loop_config\[num_steps\]=inf is invalid"):
        op.validate_arguments()
