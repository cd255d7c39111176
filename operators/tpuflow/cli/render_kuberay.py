"""`tpuflow render raycluster|rayservice`: the KubeRay manifests the operators would apply, as YAML.

Pass --dag-id/--run-id/--task-id to get the name and ownership labels the operators would use for that
task instance; otherwise --name (default "tpuflow-<generation>-<topology>"). serveConfigV2 is printed
as a literal block so it reads like the KubeRay samples. `rayservice --llm MODEL_ID` serves the model with
Ray Serve LLM (vLLM) on the slice, on the vLLM TPU image (tpuflow.serve.llm).

On a multi-host slice each application's TPU placement is derived from the slice
(tpuflow.serve.config.place_on_slice): the app builder's args get accelerator_type,
accelerator_config.topology and chips_per_host (what a replica needs to reserve a whole slice; stderr
names them), and a value the user declared that contradicts the slice is refused, never rewritten.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from tpuflow.cli.slice_cmd import add_identity_arguments, add_slice_arguments, identity_from_args, slice_from_args
from tpuflow.errors import UserInputError
from tpuflow.kuberay import DEFAULT_RAY_VERSION, DEFAULT_UPGRADE_STRATEGY
from tpuflow.kuberay.manifests import (
    UPGRADE_STRATEGIES,
    RayClusterTemplate,
    raycluster_manifest,
    rayservice_manifest,
)
from tpuflow.kuberay.serve_config import serve_config_dict
from tpuflow.kubernetes.ownership import resource_name
from tpuflow.kubernetes.values import parse_key_values
from tpuflow.labels import kubernetes_ownership_labels
from tpuflow.serve.config import check_tpu_placement, place_on_slice
from tpuflow.tpu import TpuSlice


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(manifest: dict[str, Any]) -> str:
    return yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def _common(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser)
    parser.add_argument("--name", default=None, help="object name (default: derived from the slice or task)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--image", default=None, help=f"Ray image (default rayproject/ray:{DEFAULT_RAY_VERSION}-py311)")
    parser.add_argument("--ray-version", default=DEFAULT_RAY_VERSION)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="env for head and workers")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--head-cpu", default="2")
    parser.add_argument("--head-memory", default="8Gi")
    parser.add_argument("--worker-cpu", default=None, help="TPU host container cpu (requests = limits)")
    parser.add_argument("--worker-memory", default=None, help="TPU host container memory (requests = limits)")
    parser.add_argument("--service-account", default=None)
    parser.add_argument("--shm-size", default=None, help="sizeLimit of the /dev/shm memory emptyDir")
    add_identity_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of YAML")


def _template(args: argparse.Namespace, default_image: str | None = None) -> RayClusterTemplate:
    tpu = slice_from_args(args)
    worker = {k: v for k, v in (("cpu", args.worker_cpu), ("memory", args.worker_memory)) if v}
    return RayClusterTemplate(
        tpu=tpu,
        image=args.image or default_image or f"rayproject/ray:{args.ray_version}-py311",
        ray_version=args.ray_version,
        env=parse_key_values("--env", args.env),
        head_resources={"cpu": args.head_cpu, "memory": args.head_memory},
        worker_resources=worker,
        service_account=args.service_account,
        shm_size=args.shm_size,
    ).validated()


def _identity(args: argparse.Namespace, template: RayClusterTemplate) -> tuple[str, dict[str, str]]:
    labels = parse_key_values("--label", args.label)
    identity = identity_from_args(args)
    if identity is not None:
        name = resource_name(identity.dag_id, identity.run_id, identity.task_id, identity.map_index)
        return args.name or name, {**labels, **kubernetes_ownership_labels(identity)}
    tpu = template.tpu
    return args.name or f"tpuflow-{tpu.generation.name}-{tpu.topology}", labels


def _print(manifest: dict[str, Any], as_json: bool) -> None:
    print(json.dumps(manifest, indent=2) if as_json else to_yaml(manifest), end="" if not as_json else "\n")


def _raycluster(args: argparse.Namespace) -> int:
    template = _template(args)
    name, labels = _identity(args, template)
    _print(raycluster_manifest(template, name=name, namespace=args.namespace, labels=labels), args.json)
    return 0


def _load_serve_config(args: argparse.Namespace) -> dict[str, Any]:
    if args.serve_config:
        path = Path(args.serve_config)
        if not path.is_file():
            raise UserInputError("--serve-config", args.serve_config, "give a YAML or JSON file with the Serve config")
        try:
            data = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            problem = " ".join(str(err).split())[:160]
            raise UserInputError("--serve-config", args.serve_config, f"not valid YAML/JSON ({problem})") from None
        if not isinstance(data, dict):
            raise UserInputError("--serve-config", args.serve_config, 'the file must hold {"applications": [...]}')
        return data
    if not args.import_path:
        raise UserInputError("--import-path", None, "give --import-path module:app or --serve-config FILE")
    app: dict[str, Any] = {"name": args.app_name, "import_path": args.import_path, "route_prefix": args.route_prefix}
    app_args = {k: _json_value(v) for k, v in parse_key_values("--app-arg", args.app_arg).items()}
    if app_args:
        app["args"] = app_args
    return {"applications": [app]}


def _check_app_args(args: argparse.Namespace) -> None:
    if args.app_arg and not args.import_path:
        raise UserInputError("--app-arg", args.app_arg[0], "give --app-arg with --import-path (a config file has args)")
    if args.app_arg and args.serve_config:
        raise UserInputError("--app-arg", args.app_arg[0], "put the args in the --serve-config file instead")


def _note_derived(before: dict[str, Any], after: dict[str, Any], tpu: TpuSlice) -> None:
    """Name on stderr what the render added to each application's args (stdout stays the manifest)."""
    for old, new in zip(before.get("applications", []), after.get("applications", []), strict=True):
        old_args, new_args = old.get("args") or {}, new.get("args") or {}
        added = [k for k in new_args if old_args.get(k) != new_args[k]]
        if added:
            print(
                f"tpuflow: applications[{new.get('name')}].args: {', '.join(added)} derived from the "
                f"{tpu.generation.name} {tpu.topology} slice (the app builder receives them)",
                file=sys.stderr,
            )


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _llm(args: argparse.Namespace) -> Any:
    from tpuflow.serve.deployment_options import DeploymentOptions
    from tpuflow.serve.llm import LlmServe

    if args.serve_config or args.import_path:
        raise UserInputError("--llm", args.llm, "give --llm or --serve-config/--import-path, not both")
    engine = {k: _json_value(v) for k, v in parse_key_values("--engine-kwarg", args.engine_kwarg).items()}
    autoscaling = {
        k: v
        for k, v in (
            ("min_replicas", args.min_replicas),
            ("max_replicas", args.max_replicas),
            ("target_ongoing_requests", args.target_ongoing_requests),
        )
        if v is not None
    }
    options = DeploymentOptions(
        num_replicas=args.num_replicas,
        autoscaling_config=autoscaling or None,
        max_ongoing_requests=args.max_ongoing_requests,
        max_queued_requests=args.max_queued_requests,
        request_timeout_s=args.request_timeout,
    ).validated()
    return LlmServe(
        args.llm,
        model_source=args.model_source,
        max_model_len=args.max_model_len,
        engine_kwargs=engine,
        deployment_options=options,
        route_prefix=args.route_prefix,
        hf_secret=args.hf_secret or None,
        cache_bucket=args.cache_bucket,
    )


def _rayservice(args: argparse.Namespace) -> int:
    if args.llm:
        from tpuflow.kuberay.llm_service import llm_rayservice_manifest
        from tpuflow.serve.llm import DEFAULT_VLLM_TPU_IMAGE

        llm = _llm(args)
        template = _template(args, DEFAULT_VLLM_TPU_IMAGE)
        name, labels = _identity(args, template)
        manifest = llm_rayservice_manifest(
            template, llm, name=name, namespace=args.namespace, labels=labels, upgrade_strategy=args.upgrade_strategy
        )
        _print(manifest, args.json)
        return 0
    _check_app_args(args)
    template = _template(args)
    name, labels = _identity(args, template)
    given = serve_config_dict(_load_serve_config(args))
    # The slice is known here: derive a multi-host replica's placement rather than refuse its absence.
    config = place_on_slice(given, template.tpu)
    _note_derived(given, config, template.tpu)
    # The deploy operator's rule (RayServeDeployOperator): what is left must fit the slice.
    check_tpu_placement(config, template.tpu)
    manifest = rayservice_manifest(
        template,
        config,
        name=name,
        namespace=args.namespace,
        labels=labels,
        upgrade_strategy=args.upgrade_strategy,
    )
    _print(manifest, args.json)
    return 0


def register(renderers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = renderers.add_parser("raycluster", help="KubeRay RayCluster (CPU head + TPU worker group) for a slice")
    _common(cluster)
    cluster.set_defaults(func=_raycluster)
    service = renderers.add_parser("rayservice", help="KubeRay RayService (serveConfigV2 + the slice's cluster)")
    _common(service)
    service.add_argument("--serve-config", default=None, help="Serve config file (YAML/JSON, REST shape)")
    service.add_argument(
        "--import-path",
        default=None,
        help="module:app, for a one-application config (multi-host: its TPU placement args come from the slice)",
    )
    service.add_argument(
        "--app-arg", action="append", default=[], metavar="KEY=VALUE", help="an arg of the app builder (JSON value)"
    )
    service.add_argument("--app-name", default="default")
    service.add_argument("--route-prefix", default="/")
    service.add_argument("--upgrade-strategy", default=DEFAULT_UPGRADE_STRATEGY, choices=UPGRADE_STRATEGIES)
    llm = service.add_argument_group("Ray Serve LLM (vLLM on the slice; image default: the vLLM TPU image)")
    llm.add_argument("--llm", default=None, metavar="MODEL_ID", help="serve this model with ray.serve.llm")
    llm.add_argument("--model-source", default=None, help="Hugging Face id or gs:// path (default: MODEL_ID)")
    llm.add_argument("--max-model-len", type=int, default=4096, help="vLLM context length (default 4096)")
    llm.add_argument("--engine-kwarg", action="append", default=[], metavar="KEY=VALUE", help="vLLM engine argument")
    llm.add_argument("--hf-secret", default="hf-secret:hf_api_token", help="Secret NAME[:KEY] with the HF token")
    llm.add_argument("--cache-bucket", default=None, help="GCS bucket for the XLA cache at /data (GCS FUSE)")
    deploy = service.add_argument_group("Serve deployment settings (--llm)")
    deploy.add_argument("--num-replicas", type=int, default=None, help="replicas (default: one per slice)")
    deploy.add_argument("--min-replicas", type=int, default=None, help="autoscaling lower bound")
    deploy.add_argument("--max-replicas", type=int, default=None, help="autoscaling upper bound (<= slices)")
    deploy.add_argument("--target-ongoing-requests", type=float, default=None, help="autoscaling target")
    deploy.add_argument("--max-ongoing-requests", type=int, default=None)
    deploy.add_argument("--max-queued-requests", type=int, default=None)
    deploy.add_argument("--request-timeout", type=float, default=None, help="seconds (http_options.request_timeout_s)")
    service.set_defaults(func=_rayservice)
