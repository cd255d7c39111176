"""Local Ray nodes inherit an allowlist of the launching process's environment: never Airflow's secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuflow.local.cluster import CLUSTER_ENV, LocalRayCluster
from tpuflow.local.node_env import node_environment
from tpuflow.tpu import TpuSlice

LAUNCHER = {
    # what `tpuflow airflow up` and an Airflow worker carry
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret",
    "AIRFLOW__CORE__FERNET_KEY": "fernet-key",
    "AIRFLOW_CONN_GCP": "google-cloud-platform://?key=secret",
    "AIRFLOW_VAR_X": "1",
    "AIRFLOW_HOME": "/home/u/airflow",
    "DATABASE_PASSWORD": "hunter2",
    "AWS_SECRET_ACCESS_KEY": "aws",
    # the launcher's own Ray/TPU settings: the cluster sets its own
    "RAY_ADDRESS": "10.0.0.1:6379",
    "TPU_NAME": "real-slice",
    # what Ray, the interpreter and the workloads read
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TMPDIR": "/tmp",
    "VIRTUAL_ENV": "/venv",
    "PYTHONPATH": "/src",
    "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443",
    "GOOGLE_APPLICATION_CREDENTIALS": "/creds.json",
    "TPUFLOW_GCS_REQUEST_TIMEOUT_S": "30",
    "JAX_COMPILATION_CACHE_DIR": "/cache",
    "XLA_FLAGS": "--x",
    "HTTPS_PROXY": "http://proxy:3128",
}
KEPT = {
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "TPUFLOW_GCS_REQUEST_TIMEOUT_S",
    "JAX_COMPILATION_CACHE_DIR",
    "XLA_FLAGS",
    "HTTPS_PROXY",
}


# what the nodes derive from STORAGE_EMULATOR_HOST for the client libraries (tpuflow.storage.emulator_env)
DERIVED = {"CLOUD_STORAGE_EMULATOR_ENDPOINT": "http://127.0.0.1:4443", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def test_nodes_inherit_only_the_allowlist() -> None:
    env = node_environment(LAUNCHER)
    assert set(env) == KEPT | set(DERIVED)
    assert all(env[k] == LAUNCHER[k] for k in KEPT)
    assert {k: env[k] for k in DERIVED} == DERIVED


def test_nodes_get_the_metadata_stand_in_beside_the_emulator() -> None:
    stand_in = "127.0.0.1:5555"
    env = node_environment({**LAUNCHER, "TPUFLOW_GCE_METADATA_HOST": stand_in, "GCE_METADATA_HOST": "stale:1"})
    expected = dict.fromkeys(("GCE_METADATA_HOST", "GCE_METADATA_IP", "GCE_METADATA_ROOT"), stand_in)
    assert {k: env[k] for k in expected} == expected  # the emulator's stand-in, over a stale one


def test_the_client_libraries_names_are_inherited_as_set() -> None:
    """A launcher that exported the libraries' variables itself (say, from emulator_env()) passes them on."""
    given = {
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": "http://127.0.0.1:1",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "GCE_METADATA_HOST": "127.0.0.1:2",
        "GCE_METADATA_IP": "127.0.0.1:2",
        "GCE_METADATA_ROOT": "127.0.0.1:2",
    }
    assert node_environment(given) == given


def test_without_an_emulator_nodes_get_none_of_its_variables() -> None:
    launcher = {k: v for k, v in LAUNCHER.items() if k != "STORAGE_EMULATOR_HOST"}
    env = node_environment({**launcher, "TPUFLOW_GCE_METADATA_HOST": "127.0.0.1:5555"})
    assert not {"CLOUD_STORAGE_EMULATOR_ENDPOINT", "GCE_METADATA_ROOT", "GCE_METADATA_HOST"} & set(env)


def test_the_cluster_env_has_no_airflow_secret_and_its_own_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in LAUNCHER.items():
        monkeypatch.setenv(key, value)
    cluster = LocalRayCluster(
        name="c",
        state_dir=str(tmp_path),
        temp_dir="/tmp/tpf-test",
        gcs_address="",
        dashboard_url="",
        serve_port=1,
        slice=None,
    )
    env = cluster._base_env(TpuSlice.from_spec("v6e", "2x2"), {"EXTRA": "given"})
    assert not [k for k in env if k.startswith("AIRFLOW")]
    assert "DATABASE_PASSWORD" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["EXTRA"] == "given" and env[CLUSTER_ENV] == "/tmp/tpf-test" and env["RAY_AUTH_MODE"] == "token"
    assert "RAY_ADDRESS" not in env and env.get("TPU_NAME") != "real-slice"
    assert env["STORAGE_EMULATOR_HOST"] == LAUNCHER["STORAGE_EMULATOR_HOST"]
