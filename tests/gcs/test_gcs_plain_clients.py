"""Plain storage code on the rehearsal (issue 45): a team's own step that writes gs:// with pyarrow, Ray Data,
gcsfs or google-cloud-storage, with no tpuflow helper, reaches the GCS emulator through the environment
tpuflow.storage.emulator_env() gives (with the GCE metadata stand-in the emulator runs beside); for Cloud Storage
that environment names none of it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.gcs_bucket import list_bucket

from tpuflow.storage import EMULATOR_ENV, METADATA_ENV, emulator_env
from tpuflow_rehearsal.gcs_emulator import GcsEmulator

SUPPORT = Path(__file__).resolve().parents[1] / "support"
CLIENTS = SUPPORT / "plain_gcs_clients.py"
# the variables of the emulator and its metadata stand-in that the libraries read, beyond STORAGE_EMULATOR_HOST
EMULATOR_NAMES = {
    "CLOUD_STORAGE_EMULATOR_ENDPOINT",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
    "GCE_METADATA_HOST",
    "GCE_METADATA_IP",
    "GCE_METADATA_ROOT",
}


# --- what emulator_env() gives ------------------------------------------------------------------------------


def test_with_an_emulator_and_its_stand_in_every_library_is_pointed_at_them() -> None:
    env = emulator_env({EMULATOR_ENV: "http://127.0.0.1:4443", METADATA_ENV: "127.0.0.1:5555", "HOME": "/h"})
    assert env == {
        EMULATOR_ENV: "http://127.0.0.1:4443",
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": "http://127.0.0.1:4443",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        METADATA_ENV: "127.0.0.1:5555",
        "GCE_METADATA_HOST": "127.0.0.1:5555",
        "GCE_METADATA_IP": "127.0.0.1:5555",
        "GCE_METADATA_ROOT": "127.0.0.1:5555",
    }


def test_an_emulator_given_without_a_scheme_gets_one_for_pyarrow() -> None:
    env = emulator_env({EMULATOR_ENV: "localhost:4443/", METADATA_ENV: "http://127.0.0.1:5555/"})
    assert env["CLOUD_STORAGE_EMULATOR_ENDPOINT"] == "http://localhost:4443"
    assert env["GCE_METADATA_ROOT"] == "127.0.0.1:5555"  # google-cloud-cpp prepends http:// itself


def test_cloud_storage_gets_none_of_the_emulators_variables() -> None:
    """No emulator configured: the real metadata server and Cloud Storage stay the libraries' own choice, even
    where a stand-in's address is left in the environment."""
    settings = {"TPUFLOW_GCS_REQUEST_TIMEOUT_S": "30"}
    assert emulator_env({METADATA_ENV: "127.0.0.1:5555", **settings}) == settings
    assert emulator_env({EMULATOR_ENV: " ", METADATA_ENV: "127.0.0.1:5555"}) == {}


def test_the_emulators_own_export_lines_give_the_whole_set(gcs_emulator: GcsEmulator) -> None:
    env = emulator_env(gcs_emulator.env())
    assert set(env) == {EMULATOR_ENV, METADATA_ENV, *EMULATOR_NAMES}
    assert env["GCE_METADATA_ROOT"] == gcs_emulator.metadata_address


def test_ray_jobs_and_serve_replicas_carry_the_whole_set(
    gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.steps import serve_config_for
    from tpuflow.rayjob.operators import RaySubmitJobOperator

    for key, value in gcs_emulator.env().items():
        monkeypatch.setenv(key, value)
    expected = emulator_env(gcs_emulator.env())
    op = RaySubmitJobOperator(
        task_id="t", entrypoint="python x.py", ray_conn_id="ray_default", env_vars={"A": "1"}, working_dir=""
    )
    assert op.build_runtime_env()["env_vars"] == {**expected, "A": "1"}
    config = serve_config_for({"backend": "local"}, {"checkpoint": "gs://b/c"}, "local:///w", "jax", workload=ADDITION)
    assert config["applications"][0]["runtime_env"]["env_vars"] == expected


# --- the libraries themselves, against the real emulator ----------------------------------------------------


def run_plain_client(library: str, prefix: str, env: dict[str, str], home: Path) -> dict[str, str]:
    """tests/support/plain_gcs_clients.py in a clean environment (no credentials, a HOME without gcloud's):
    ``env`` only. A library that waits for a metadata server that is not there fails the test at the timeout."""
    home.mkdir(exist_ok=True)
    clean = {"PATH": os.environ["PATH"], "HOME": str(home), **env}
    done = subprocess.run(
        [sys.executable, str(CLIENTS), library, prefix], env=clean, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


READ_BACK = {
    "pyarrow": {"n": [1, 2, 3]},
    "gcsfs": "written by gcsfs",
    "google-cloud-storage": "written by google-cloud-storage",
}


@pytest.mark.parametrize("library", sorted(READ_BACK))
def test_plain_code_writes_and_reads_gs_on_the_emulator(
    library: str, bucket: str, gcs_emulator: GcsEmulator, tmp_path: Path
) -> None:
    prefix = f"gs://{bucket}/plain/{library}"
    out = run_plain_client(library, prefix, emulator_env(gcs_emulator.env()), tmp_path / "home")
    assert out["read"] == READ_BACK[library]
    # it is on the emulator, as the Airflow side's client lists it
    assert out["uri"].removeprefix(f"gs://{bucket}/") in list_bucket(bucket, "plain/")


# --- Ray Data in a Ray task, on a local Ray cluster tpuflow started -----------------------------------------

RAY_DATA_JOB = """
import sys

import ray


@ray.remote(num_cpus=0)
def write(uri):
    import ray.data

    ray.data.range(20).write_parquet(uri)  # a plain gs:// path: no filesystem, no endpoint, no credentials
    return uri


ray.init()
print("wrote", ray.get(write.remote(sys.argv[1])))
"""


@pytest.mark.slow
def test_ray_data_in_a_ray_task_writes_gs_on_the_emulator(
    tmp_path: Path, bucket: str, gcs_emulator: GcsEmulator, fresh_context, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq
    from support.ray_cluster import running_cluster

    from tpuflow.rayjob.operators import RaySubmitJobOperator
    from tpuflow.storage import gcs_client

    # The cluster starts without the emulator in its environment: the job gets it from the operator alone.
    monkeypatch.delenv(EMULATOR_ENV, raising=False)
    monkeypatch.delenv(METADATA_ENV, raising=False)
    code = tmp_path / "code"
    code.mkdir()
    (code / "plain_ray_data.py").write_text(RAY_DATA_JOB)
    prefix = f"ray-data-{uuid.uuid4().hex[:8]}"
    with running_cluster("plain-ray-data", tmp_path / "clusters", "TPU-V6E", "2x2") as cluster:
        for key, value in gcs_emulator.env().items():
            monkeypatch.setenv(key, value)
        job = RaySubmitJobOperator(
            task_id="plain_ray_data",
            entrypoint=["python", "plain_ray_data.py", f"gs://{bucket}/{prefix}"],
            cluster=cluster.connection_info(),
            working_dir=str(code),
            deferrable=False,
            job_timeout=300,
        )
        job.execute(fresh_context("plain_ray_data"))
    files = [name for name in list_bucket(bucket, f"{prefix}/") if name.endswith(".parquet")]
    assert files, list_bucket(bucket)
    blobs = (gcs_client().bucket(bucket).blob(name).download_as_bytes() for name in files)
    assert sorted(v for blob in blobs for v in pq.read_table(io.BytesIO(blob)).column("id").to_pylist()) == list(
        range(20)
    )
