"""KubeRay CRD schemas and TPU samples for the tests: the CRDs tpuflow ships (TPUFLOW_KUBERAY_CRDS overrides
them) and KubeRay's TPU samples kept beside this module (kuberay_samples/, the same KubeRay version).

The schemas are read, and pruned fields found, by the Kubernetes stand-in's own CRD catalog: one reader of
KubeRay's YAML, so the tests judge manifests exactly as the stand-in's apiserver does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tpuflow_rehearsal.standins import kuberay_crds
from tpuflow_rehearsal.standins.kubernetes_catalog import CrdSchemas, unknown_fields

CRD_DIR = Path(os.environ.get("TPUFLOW_KUBERAY_CRDS") or kuberay_crds.DIRECTORY)
SAMPLES_DIR = Path(__file__).resolve().parent / "kuberay_samples"


def crd_schema(plural: str) -> dict[str, Any]:
    """spec.versions[name=v1].schema.openAPIV3Schema of ray.io_<plural>.yaml[.gz]."""
    schema = CrdSchemas.load(CRD_DIR).schema(plural)
    assert schema is not None, f"no KubeRay CRD for {plural} in {CRD_DIR} (TPUFLOW_KUBERAY_CRDS names another folder?)"
    return schema


def sample(name: str) -> dict[str, Any]:
    return yaml.safe_load((SAMPLES_DIR / name).read_text())


def schema_errors(plural: str, obj: dict[str, Any]) -> list[str]:
    """jsonschema errors plus fields the apiserver would silently prune (not in the structural schema)."""
    import jsonschema

    schema = crd_schema(plural)
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    return errors + [f"{path}: unknown field (would be pruned)" for path in unknown_fields(schema, obj)]
