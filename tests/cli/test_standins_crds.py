"""`tpuflow standins up` run outside the repository, with no CRD directory named, validates KubeRay's fields
with the CRDs tpuflow ships (issue 45: it used to find none and store objects unvalidated)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tpuflow_rehearsal.standins import kuberay_crds

CRDS_ENV = "TPUFLOW_KUBERAY_CRDS"


def tpuflow(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuflow.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def raycluster(name: str, **spec: Any) -> dict[str, Any]:
    head = {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": "ray"}]}}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {**spec, "headGroupSpec": head},
    }


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """`standins up --fake --no-gcs` from a folder outside the repository, without $TPUFLOW_KUBERAY_CRDS."""
    env = {k: v for k, v in os.environ.items() if k != CRDS_ENV}
    work = tmp_path / "standins"
    up = tpuflow(
        tmp_path, env, "standins", "up", "--workdir", str(work), "--fake", "--no-gcs", "--operation-seconds", "0"
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield work, up
    finally:
        if (work / "state.json").exists():
            down = tpuflow(tmp_path, env, "standins", "down", "--workdir", str(work))
            assert down.returncode == 0, down.stdout + down.stderr


def test_standins_up_outside_the_repository_validates_kuberays_fields(
    outside: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    work, up = outside
    shipped = (
        f"CRD schemas:     KubeRay {kuberay_crds.KUBERAY_VERSION}'s, shipped with tpuflow ({kuberay_crds.DIRECTORY})"
    )
    assert shipped in up.stdout, up.stdout
    assert json.loads((work / "state.json").read_text())["crds"] == str(kuberay_crds.DIRECTORY)
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(work / "kubeconfig")))
    create = {"group": "ray.io", "version": "v1", "namespace": "default", "plural": "rayclusters"}
    with pytest.raises(ApiException) as refused:
        api.create_namespaced_custom_object(**create, body=raycluster("bogus", bogus=1), field_validation="Strict")
    assert refused.value.status in (400, 422) and 'unknown field \\"spec.bogus\\"' in refused.value.body
    with pytest.raises(ApiException) as invalid:
        api.create_namespaced_custom_object(**create, body=raycluster("typed", enableInTreeAutoscaling="yes"))
    assert invalid.value.status == 422 and "enableInTreeAutoscaling" in invalid.value.body
    # A field of KubeRay >= 1.5.1 (token authentication) is kept, not pruned.
    created = api.create_namespaced_custom_object(
        **create, body=raycluster("token", authOptions={"mode": "token"}), field_validation="Strict"
    )
    assert created["spec"]["authOptions"] == {"mode": "token"}


def test_standins_up_refuses_a_crd_directory_from_the_environment_without_crds(tmp_path: Path) -> None:
    env = {**os.environ, CRDS_ENV: str(tmp_path)}
    up = tpuflow(tmp_path, env, "standins", "up", "--workdir", str(tmp_path / "w"), "--fake", "--no-gcs")
    assert up.returncode == 2 and up.stderr.count("\n") == 1, up.stderr
    assert f"{CRDS_ENV}=" in up.stderr and "ray.io_rayclusters.yaml" in up.stderr and "Traceback" not in up.stderr
