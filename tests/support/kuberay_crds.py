"""KubeRay CRD schemas and TPU samples for the tests (TPUFLOW_KUBERAY_CRDS, default ../shared/kuberay/crds)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = Path(os.environ.get("TPUFLOW_KUBERAY_CRDS", REPO.parent / "shared" / "kuberay" / "crds"))
SAMPLES_DIR = CRD_DIR.parent / "samples"
_SCHEMAS: dict[str, dict[str, Any]] = {}


def crd_schema(plural: str) -> dict[str, Any]:
    """spec.versions[name=v1].schema.openAPIV3Schema of ray.io_<plural>.yaml (skips when absent)."""
    path = CRD_DIR / f"ray.io_{plural}.yaml"
    if not path.is_file():
        pytest.skip(
            f"KubeRay CRDs not found at {path}; set TPUFLOW_KUBERAY_CRDS to the directory holding "
            "ray.io_rayclusters.yaml / ray.io_rayservices.yaml (KubeRay ray-operator/config/crd/bases)"
        )
    if plural not in _SCHEMAS:
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        _SCHEMAS[plural] = version["schema"]["openAPIV3Schema"]
    return _SCHEMAS[plural]


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


def unknown_fields(schema: dict[str, Any], obj: Any, path: str = "") -> list[str]:
    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = []
        for key, value in obj.items():
            if props is not None and key in props:
                out += unknown_fields(props[key], value, f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(extra, value, f"{path}.{key}")
            elif props is not None:
                out.append(f"{path}.{key}")
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [u for i, item in enumerate(obj) for u in unknown_fields(schema["items"], item, f"{path}[{i}]")]
    return []
