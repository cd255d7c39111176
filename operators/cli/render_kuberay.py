"""`tpuflow render raycluster|rayservice`: the KubeRay manifests the operators would apply, as YAML.

Pass --dag-id/--run-id/--task-id to get the name and ownership labels the operators would use for that
task instance; otherwise --name (default "tpuflow-<generation>-<topology>"). serveConfigV2 is printed
as a literal block so it reads like the KubeRay samples.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml
from tpuflow.cli.slice_cmd import add_identity_arguments, add_slice_arguments, identity_from_args, slice_from_args
from tpuflow.errors import UserInputError
from tpuflow.kuberay.k8s_values import parse_key_values
from tpuflow.kuberay.manifests import (
    DEFAULT_RAY_VERSION,
    DEFAULT_UPGRADE_STRATEGY,
    UPGRADE_STRATEGIES,
    RayClusterTemplate,
    raycluster_manifest,
    rayservice_manifest,
    resource_name,
)
from tpuflow.labels import kubernetes_ownership_labels


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


def _template(args: argparse.Namespace) -> RayClusterTemplate:
    tpu = slice_from_args(args)
    worker = {k: v for k, v in (("cpu", args.worker_cpu), ("memory", args.worker_memory)) if v}
    return RayClusterTemplate(
        tpu=tpu,
        image=args.image or f"rayproject/ray:{args.ray_version}-py311",
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
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            raise UserInputError("--serve-config", args.serve_config, 'the file must hold {"applications": [...]}')
        return data
    if not args.import_path:
        raise UserInputError("--import-path", None, "give --import-path module:app or --serve-config FILE")
    return {
        "applications": [{"name": args.app_name, "import_path": args.import_path, "route_prefix": args.route_prefix}]
    }


def _rayservice(args: argparse.Namespace) -> int:
    template = _template(args)
    name, labels = _identity(args, template)
    manifest = rayservice_manifest(
        template,
        _load_serve_config(args),
        name=name,
        namespace=args.namespace,
        labels=labels,
        upgrade_strategy=args.upgrade_strategy,
    )
    _print(manifest, args.json)
    return 0


def register(renderers: argparse._SubParsersAction) -> None:
    cluster = renderers.add_parser("raycluster", help="KubeRay RayCluster (CPU head + TPU worker group) for a slice")
    _common(cluster)
    cluster.set_defaults(func=_raycluster)
    service = renderers.add_parser("rayservice", help="KubeRay RayService (serveConfigV2 + the slice's cluster)")
    _common(service)
    service.add_argument("--serve-config", default=None, help="Serve config file (YAML/JSON, REST shape)")
    service.add_argument("--import-path", default=None, help="module:app, for a one-application config")
    service.add_argument("--app-name", default="default")
    service.add_argument("--route-prefix", default="/")
    service.add_argument("--upgrade-strategy", default=DEFAULT_UPGRADE_STRATEGY, choices=UPGRADE_STRATEGIES)
    service.set_defaults(func=_rayservice)
