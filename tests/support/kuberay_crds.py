"""KubeRay CRD schemas and TPU samples for the tests (TPUFLOW_KUBERAY_CRDS, default ../shared/kuberay/crds).

The schemas are read, and pruned fields found, by the Kubernetes stand-in's own CRD catalog: one reader of
KubeRay's YAML, so the tests judge manifests exactly as the stand-in's apiserver does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuflow.dev.standins.kubernetes_catalog import CrdSchemas, unknown_fields

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = Path(os.environ.get("TPUFLOW_KUBERAY_CRDS", REPO.parent / "shared" / "kuberay" / "crds"))
SAMPLES_DIR = CRD_DIR.parent / "samples"


def crd_schema(plural: str) -> dict[str, Any]:
    """spec.versions[name=v1].schema.openAPIV3Schema of ray.io_<plural>.yaml (skips when absent)."""
    schema = CrdSchemas.load(CRD_DIR).schema(plural)
    if schema is None:
        pytest.skip(
            f"KubeRay CRDs not found at {CRD_DIR / f'ray.io_{plural}.yaml'}; set TPUFLOW_KUBERAY_CRDS to the directory "
            "holding ray.io_rayclusters.yaml / ray.io_rayservices.yaml (KubeRay ray-operator/config/crd/bases)"
        )
    return schema


def sample(name: str) -> dict[str, Any]:
    path = SAMPLES_DIR / name
    if not path.is_file():
        pytest.skip(
            f"KubeRay TPU sample {path} not found (set TPUFLOW_KUBERAY_CRDS to <kuberay>/crds with samples/ beside it)"
        )
    return yaml.safe_load(path.read_text())


def schema_errors(plural: str, obj: dict[str, Any]) -> list[str]:
    """jsonschema errors plus fields the apiserver would silently prune (not in the structural schema)."""
    import jsonschema

    schema = crd_schema(plural)
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    return errors + [f"{path}: unknown field (would be pruned)" for path in unknown_fields(schema, obj)]
