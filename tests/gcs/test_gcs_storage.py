"""gs:// against a real GCS server (fake-gcs-server on loopback): the launcher, the Airflow-side
client, the Ray-side pyarrow resolver, the report, leases and their CLI, the preflight and the
client retries under injected faults. Fast: no Ray cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support.fault_proxy import FaultProxy, Rule, any_request, writes_to
from support.gcs_bucket import list_bucket

from tpuflow.errors import UserInputError
from tpuflow.storage import METADATA_ENV
from tpuflow_rehearsal.gcs_emulator import EMULATOR_ENV, GcsEmulator

REPO = Path(__file__).resolve().parents[2]
TPUFLOW = [sys.executable, "-m", "tpuflow.cli"]


@pytest.fixture
def proxy(gcs_emulator: GcsEmulator, emulator_at):
    """The fault proxy in front of the session's emulator; this test's clients talk through it."""
    p = FaultProxy(gcs_emulator.url).start()
    emulator_at(p.url)
    yield p
    p.stop()


@pytest.fixture
def ray_storage():
    """The Ray side's storage module (workloads/ ships as top-level packages in a job's working_dir)."""
    sys.path.insert(0, str(REPO / "workloads"))
    try:
        from tpuflow_driver import storage

        yield storage
    finally:
        sys.path.remove(str(REPO / "workloads"))


# --- the launcher -------------------------------------------------------------------------------


def test_local_gcs_up_and_down_by_pid(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (EMULATOR_ENV, METADATA_ENV)}
    env["TPUFLOW_HOME"] = str(tmp_path / "home")
    up = subprocess.run(
        [*TPUFLOW, "local", "gcs", "up", "--bucket", "made-by-up", "--bucket", "second-one"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert up.returncode == 0, up.stderr
    emulator = GcsEmulator.load(tmp_path / "home" / "gcs-emulator")
    assert emulator is not None
    try:  # `down` runs whatever fails below: nothing the test started outlives it
        emulator_line, metadata_line = up.stdout.splitlines()
        assert emulator_line.startswith(f"export {EMULATOR_ENV}=http://127.0.0.1:")
        assert metadata_line.startswith(f"export {METADATA_ENV}=127.0.0.1:")
        url, metadata = emulator_line.split("=", 1)[1], metadata_line.split("=", 1)[1]
        assert emulator.url == url and emulator.is_alive()
        assert emulator.metadata_address == metadata and emulator.metadata_is_alive()
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": url})
        assert {b.name for b in client.list_buckets()} == {"made-by-up", "second-one"}
        again = subprocess.run([*TPUFLOW, "local", "gcs", "up"], capture_output=True, text=True, timeout=60, env=env)
        assert again.returncode == 1 and "already runs" in again.stderr
    finally:
        down = subprocess.run([*TPUFLOW, "local", "gcs", "down"], capture_output=True, text=True, timeout=60, env=env)
    assert down.returncode == 0 and f"pid {emulator.pid}" in down.stdout, down.stdout + down.stderr
    assert f"GCE metadata stand-in (pid {emulator.metadata_pid})" in down.stdout, down.stdout
    assert not emulator.is_alive() and not emulator.metadata_is_alive()
    assert GcsEmulator.load(tmp_path / "home" / "gcs-emulator") is None
    down = subprocess.run([*TPUFLOW, "local", "gcs", "down"], capture_output=True, text=True, timeout=60, env=env)
    assert down.returncode == 0 and "nothing to stop" in down.stdout


def test_gcs_up_on_a_given_port(tmp_path: Path) -> None:
    from tpuflow_rehearsal.gcs_emulator import free_port

    port = free_port()
    emulator = GcsEmulator.start(port=port, state_dir=tmp_path)
    try:
        assert emulator.url == f"http://127.0.0.1:{port}"
    finally:
        assert emulator.stop()


# --- Airflow side ---------------------------------------------------------------------------------


def test_write_report_writes_report_json_to_gs(bucket: str) -> None:
    from tpuflow.pipeline.steps import write_report
    from tpuflow.storage import read_text

    run_dir = f"gs://{bucket}/tpu_llm_pipeline_local/2026-11-03"
    report = write_report(
        run_dir, {"accuracy": 0.97, "n": 200}, {"choices": [{"text": "42"}]}, {"serve_url": "http://127.0.0.1:8000"}
    )
    assert list_bucket(bucket) == ["tpu_llm_pipeline_local/2026-11-03/report.json"]
    assert json.loads(read_text(f"{run_dir}/report.json")) == report
    assert read_text(f"{run_dir}/missing.json") is None


def test_kept_driver_log_goes_to_gs(bucket: str) -> None:
    from tpuflow.output_links import browse_url
    from tpuflow.storage import read_text, write_text

    uri = f"gs://{bucket}/run/logs/train-jax.log"
    write_text(uri, "[train_jax] step 100/100\n")
    assert read_text(uri) == "[train_jax] step 100/100\n"
    assert (
        browse_url(uri) == f"https://console.cloud.google.com/storage/browser/_details/{bucket}/run/logs/train-jax.log"
    )


def test_the_budget_guard_finds_earlier_ledgers_under_a_gs_folder(bucket: str) -> None:
    """find_files on gs://: one ledger per run folder, nothing deeper or beside them (the guard's basis)."""
    from tpuflow.storage import find_files, write_text

    root = f"gs://{bucket}/outputs/team_dag"
    for name in ("2026-12-01/ledger.json", "2026-12-02/ledger.json", "2026-12-02/logs/ledger.json", "ledger.json"):
        write_text(f"{root}/{name}", "{}")
    write_text(f"gs://{bucket}/outputs/team_dag_2/2026-12-01/ledger.json", "{}")  # another DAG's, same prefix
    assert find_files(root, "ledger.json") == [f"{root}/2026-12-01/ledger.json", f"{root}/2026-12-02/ledger.json"]
    assert find_files(f"gs://{bucket}/nothing-here", "ledger.json") == []


def test_storage_emulator_host_reaches_ray_jobs_and_serve_replicas(
    gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.steps import serve_config_for
    from tpuflow.rayjob.operators import RaySubmitJobOperator

    op = RaySubmitJobOperator(
        task_id="t", entrypoint="python -c pass", ray_conn_id="ray_default", env_vars={"A": "1"}, working_dir=""
    )
    # STORAGE_EMULATOR_HOST alone (no metadata stand-in named): the emulator, for every library that needs none
    # (tests/gcs/test_gcs_plain_clients.py: with the stand-in)
    monkeypatch.delenv(METADATA_ENV, raising=False)
    storage = {
        EMULATOR_ENV: gcs_emulator.url,
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs_emulator.url,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }
    assert op.build_runtime_env()["env_vars"] == {"A": "1", **storage}
    config = serve_config_for({"backend": "local"}, {"checkpoint": "gs://b/c"}, "local:///w", "jax", workload=ADDITION)
    assert config["applications"][0]["runtime_env"]["env_vars"] == storage


def test_without_an_emulator_nothing_is_added(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.steps import serve_config_for
    from tpuflow.rayjob.operators import RaySubmitJobOperator

    monkeypatch.delenv(EMULATOR_ENV)
    op = RaySubmitJobOperator(task_id="t", entrypoint="x", ray_conn_id="ray_default", working_dir="")
    assert "env_vars" not in op.build_runtime_env()
    config = serve_config_for({"backend": "local"}, {"checkpoint": "/c"}, "local:///w", "jax", workload=ADDITION)
    assert config["applications"][0]["runtime_env"] == {"working_dir": "local:///w"}


# --- leases ---------------------------------------------------------------------------------------


def test_exactly_one_of_many_racing_acquirers_wins_each_slot(bucket: str) -> None:
    from tpuflow.slices.leases import lease_store

    root, n, slots = f"gs://{bucket}/leases", 12, 2
    barrier, won, errors = threading.Barrier(n), {}, []

    def race(i: int) -> None:
        store = lease_store(root)  # each racer its own client, as separate Airflow workers have
        barrier.wait()
        try:
            lease = store.try_acquire(f"dag/run-{i}", slots)
        except Exception as err:  # noqa: BLE001 -- reported below
            errors.append(err)
            return
        if lease is not None:
            won[f"dag/run-{i}"] = lease.slot

    threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(won.values()) == list(range(slots)), won  # every slot once, no slot twice
    store = lease_store(root)
    assert {slot: lease.holder for slot, lease in store.holders(slots).items()} == {s: h for h, s in won.items()}
    assert list_bucket(bucket) == ["leases/slot-0.json", "leases/slot-1.json"]
    holder = next(iter(won))
    assert store.try_acquire(holder, slots).slot == won[holder]  # a retry of the winner keeps its slot
    assert store.try_acquire("dag/latecomer", slots) is None
    assert store.release(holder) == [won[holder]]
    assert store.try_acquire("dag/latecomer", slots).slot == won[holder]


def test_leases_cli_lists_and_frees_a_gs_root(bucket: str) -> None:
    from tpuflow.slices.leases import lease_store

    root = f"gs://{bucket}/slice-leases"
    lease_store(root).try_acquire("tpu_llm_pipeline_local/manual__1", 2)
    cli = [*TPUFLOW, "leases"]
    listed = subprocess.run(
        [*cli, "list", "--lease-root", root, "--max-slices", "2"], capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert "slot 0: tpu_llm_pipeline_local/manual__1" in listed.stdout
    freed = subprocess.run(
        [*cli, "free", "--lease-root", root, "tpu_llm_pipeline_local/manual__1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert freed.returncode == 0 and "freed slot(s) [0]" in freed.stdout, freed.stdout + freed.stderr
    listed = subprocess.run([*cli, "list", "--lease-root", root], capture_output=True, text=True, timeout=120)
    assert f"no slice leases held in {root}" in listed.stdout
    assert list_bucket(bucket) == []


# --- preflight ------------------------------------------------------------------------------------


def test_preflight_accepts_a_writable_bucket_and_leaves_nothing(bucket: str) -> None:
    from tpuflow.storage import check_writable

    check_writable(f"gs://{bucket}/runs")
    assert list_bucket(bucket) == []


def test_preflight_names_a_missing_bucket_and_the_role() -> None:
    from tpuflow.storage import check_writable

    with pytest.raises(UserInputError) as err:
        check_writable("gs://no-such-bucket-here/runs/x", "output_dir")
    msg = str(err.value)
    assert "\n" not in msg and "gs://no-such-bucket-here/runs/x" in msg
    assert "'no-such-bucket-here' does not exist" in msg and "roles/storage.objectUser" in msg


@pytest.mark.parametrize("uri", ["gs:/bucket/x", "gs://", "gs://UPPER/x", "gs://ab/x", "s3://bucket/x"])
def test_preflight_rejects_malformed_uris(uri: str) -> None:
    from tpuflow.storage import check_writable

    with pytest.raises(UserInputError) as err:
        check_writable(uri, "output_dir")
    assert f"output_dir={uri!r}" in str(err.value) and "gs://BUCKET/PREFIX" in str(err.value)


def test_preflight_403_names_path_bucket_and_role(bucket: str, proxy: FaultProxy) -> None:
    from tpuflow.storage import check_writable

    proxy.add(Rule(403, writes_to()))
    with pytest.raises(UserInputError) as err:
        check_writable(f"gs://{bucket}/runs", "output_dir")
    msg = str(err.value)
    assert "\n" not in msg and f"gs://{bucket}/runs" in msg and f"bucket {bucket!r}" in msg
    assert "HTTP 403" in msg and f"grant them roles/storage.objectUser on gs://{bucket}" in msg
    assert proxy.injected and all(fault == 403 for *_, fault in proxy.injected)


PREFLIGHT_DAG = """
from airflow.sdk import DAG, BaseOperator
from tpuflow.pipeline.params import pipeline_params
from tpuflow.pipeline.steps import CheckParamsOperator


class StartCluster(BaseOperator):
    def execute(self, context):
        raise AssertionError("the cluster task must not run")


with DAG(DAG_ID, schedule=None, params=pipeline_params()) as dag:
    CheckParamsOperator(task_id="check_params", output_dir=OUTPUT_DIR + "/{{ dag.dag_id }}",
                        retries=0) >> StartCluster(task_id="start_cluster")
"""


def test_check_params_task_fails_before_the_cluster_task(
    bucket: str, migrated_airflow_db: Path, proxy: FaultProxy
) -> None:
    """In a real Airflow run: the first task fails on an unwritable output root, nothing after it runs."""
    dag_id = "gcs_preflight_test"
    path = migrated_airflow_db / f"{dag_id}.py"
    path.write_text(f"DAG_ID = {dag_id!r}\nOUTPUT_DIR = {f'gs://{bucket}'!r}\n" + PREFLIGHT_DAG)
    sys.path.insert(0, str(migrated_airflow_db))
    try:
        dag = __import__(dag_id).dag
    finally:
        sys.path.remove(str(migrated_airflow_db))
    proxy.add(Rule(403, writes_to()))
    try:
        run = dag.test()
    finally:
        sys.modules.pop(dag_id, None)
        path.unlink(missing_ok=True)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states == {"check_params": "failed", "start_cluster": "upstream_failed"}
    assert any(f"{dag_id}/.tpuflow-write-check-" in p for _, p, _ in proxy.injected)


# --- transient faults: the clients' own retries ---------------------------------------------------


def test_parquet_write_and_read_survive_503_429_and_resets(bucket: str, proxy: FaultProxy, ray_storage) -> None:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    for fault in (503, 429, "reset"):
        proxy.add(Rule(fault, any_request, every=3, limit=4))
    fs, path = ray_storage.resolve_with_deadline(f"gs://{bucket}/data/train")  # what prep and Ray Data use
    table = pa.table({"problem_id": list(range(5000)), "prompt": [f"{i}+1=" for i in range(5000)]})
    for i in range(4):
        pq.write_table(table, f"{path}/part-{i}.parquet", filesystem=fs)
    ray_storage.write_text(f"gs://{bucket}/data/_SUCCESS", "{}")
    assert pq.read_table(path, filesystem=fs).num_rows == 20000
    assert {fault for *_, fault in proxy.injected} == {503, 429, "reset"}
    assert any(method == "PUT" for method, *_ in proxy.injected), "a data chunk upload was failed, not only setup calls"
    proxy.clear()
    assert all(info.size > 0 for info in fs.get_file_info(pafs.FileSelector(path)))
    assert list_bucket(bucket, "data/") == ["data/_SUCCESS"] + [f"data/train/part-{i}.parquet" for i in range(4)]


def test_airflow_side_writes_survive_transient_errors(bucket: str, proxy: FaultProxy) -> None:
    from tpuflow.storage import read_text, write_text

    proxy.add(Rule(503, writes_to("report"), limit=2))
    proxy.add(Rule("reset", writes_to("log"), limit=1))
    write_text(f"gs://{bucket}/r/report.json", "{}")
    write_text(f"gs://{bucket}/r/logs/prep.log", "ok")
    assert [f for *_, f in proxy.injected] == [503, 503, "reset"]
    assert read_text(f"gs://{bucket}/r/report.json") == "{}" and read_text(f"gs://{bucket}/r/logs/prep.log") == "ok"


def test_ray_side_resolver_uses_the_emulator(bucket: str, ray_storage, gcs_emulator: GcsEmulator) -> None:
    fs, path = ray_storage.resolve(f"gs://{bucket}/a/b/")
    assert fs.type_name == "gcs" and path == f"{bucket}/a/b"
    ray_storage.write_text(f"gs://{bucket}/a/b/spec.json", '{"x": 1}')
    assert ray_storage.read_text(f"gs://{bucket}/a/b/spec.json") == '{"x": 1}'
    assert ray_storage.exists(f"gs://{bucket}/a/b/spec.json") and not ray_storage.exists(f"gs://{bucket}/nope")
    ray_storage.delete(f"gs://{bucket}/a")
    assert list_bucket(bucket) == []
    assert ray_storage.uri(fs, f"{bucket}/ckpt") == f"gs://{bucket}/ckpt"


@pytest.mark.parametrize(
    ("root", "said"),
    [
        ("gs://tpuflow-no-such-bucket/run", "roles/storage.objectUser"),
        ("gs://Bad_Bucket!/run", "gs://BUCKET/PREFIX"),
    ],
)
def test_the_shipped_pipeline_fails_at_its_first_task_on_a_bad_output_root(
    root: str, said: str, migrated_airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: Any
) -> None:
    """tpu_llm_pipeline_local with a missing bucket or a malformed URI: check_params fails naming it, no
    lease is taken and no cluster starts (the teardown tasks find nothing to stop)."""
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.factory import build_pipeline_dag

    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path / "home"))
    dag = build_pipeline_dag("tpu_llm_pipeline_local", workload=ADDITION, schedule=None, output_root=root)
    run = dag.test()
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["check_params"] == "failed", states
    assert all(states[t] in ("upstream_failed", "skipped", None) for t in ("acquire_slice", "start_cluster"))
    assert not list((tmp_path / "home").glob("clusters/*/state.json")), "no cluster may start"
    assert not list((tmp_path / "home").glob("slice-leases/**/*.json")), "no lease may be taken"
    out = "".join(capfd.readouterr())
    assert any(root in line and said in line for line in out.splitlines()), out[-3000:]
