"""A storage server that accepts connections and never answers (the fault proxy's "stall") never holds a call
past TPUFLOW_GCS_REQUEST_TIMEOUT_S: Ray Train's storage filesystem (tpuflow_driver.deadline_fs, what a
checkpoint upload goes through), prep's parquet writes, Ray Data's parquet reads and the Airflow side
(tpuflow.storage) fail naming the path. Fast: a 1 s deadline, no Ray cluster."""

from __future__ import annotations

import pickle
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fault_proxy import FaultProxy, Rule, any_request, writes_to
from support.gcs_bucket import list_bucket

from tpuflow_rehearsal.gcs_emulator import GcsEmulator

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 1.0
# the deadline, and what a slow 2-core machine adds to it (thread start, the client giving up)
WITHIN_S = DEADLINE_S + 3.0


@contextmanager
def workloads_importable() -> Iterator[None]:
    """workloads/ on sys.path for the block's imports (a job's working_dir ships it as top-level packages)."""
    sys.path.insert(0, str(REPO / "workloads"))
    try:
        yield
    finally:
        sys.path.remove(str(REPO / "workloads"))


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUFLOW_GCS_REQUEST_TIMEOUT_S", str(DEADLINE_S))


@pytest.fixture
def proxy(gcs_emulator: GcsEmulator, emulator_at: Any) -> Iterator[FaultProxy]:
    p = FaultProxy(gcs_emulator.url).start()
    emulator_at(p.url)
    yield p
    p.stop()


@pytest.fixture
def ray_storage() -> Iterator[Any]:
    """The Ray side's storage module (workloads/ ships as top-level packages in a job's working_dir)."""
    with workloads_importable():
        from tpuflow_driver import storage

        yield storage


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> Path:
    """What a Ray Train worker uploads: a local checkpoint folder."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "state.msgpack").write_bytes(b"\x01" * 300_000)
    (folder / "meta.json").write_text('{"step": 50}')
    return folder


def _raises_within(fn: Any, error: type[BaseException], *said: str) -> BaseException:
    started = time.monotonic()
    with pytest.raises(error) as caught:
        fn()
    took = time.monotonic() - started
    assert took < WITHIN_S, f"took {took:.1f} s"
    for words in said:
        assert words in str(caught.value), str(caught.value)
    return caught.value


# --- the Ray side: Ray Train's storage_filesystem -------------------------------------------------


def test_a_checkpoint_upload_to_a_stalled_server_fails_naming_the_path(
    bucket: str, proxy: FaultProxy, ray_storage: Any, checkpoint_dir: Path
) -> None:
    """Ray Train's upload is pyarrow.fs.copy_files to its storage_filesystem (64 MiB chunks)."""
    import pyarrow.fs as pafs
    from tpuflow_driver.deadline_fs import StorageStalled

    proxy.add(Rule("stall", writes_to("/checkpoint_")))
    fs, path = ray_storage.resolve_with_deadline(f"gs://{bucket}/runs/train")
    target = f"{path}/checkpoint_000001"
    _raises_within(
        lambda: pafs.copy_files(str(checkpoint_dir), target, destination_filesystem=fs, chunk_size=64 * 1024 * 1024),
        StorageStalled,
        f"gs://{bucket}/runs/train/checkpoint_000001",
        f"within {DEADLINE_S:g} s (TPUFLOW_GCS_REQUEST_TIMEOUT_S)",
    )
    assert proxy.injected, "the upload reached the server"


def test_a_write_that_stalls_after_its_upload_started_fails_at_its_deadline(
    bucket: str, proxy: FaultProxy, ray_storage: Any
) -> None:
    """The upload session opened; its data never gets an answer: the close (which sends it) fails in time."""
    import pyarrow.fs as pafs
    from tpuflow_driver.deadline_fs import StorageStalled

    fs, path = ray_storage.resolve_with_deadline(f"gs://{bucket}/runs")
    stream = fs.open_output_stream(f"{path}/checkpoint_000002/state.bin")
    proxy.add(Rule("stall", any_request))

    def write_and_close() -> None:
        stream.write(b"\x02" * 1_000_000)
        stream.close()

    _raises_within(write_and_close, StorageStalled, f"gs://{bucket}/runs/checkpoint_000002/state.bin")
    _raises_within(lambda: fs.get_file_info(f"{path}/x"), StorageStalled, f"gs://{bucket}/runs/x")
    assert isinstance(fs, pafs.PyFileSystem)


def test_the_drivers_small_files_and_checkpoint_loads_have_the_deadline_too(
    bucket: str, proxy: FaultProxy, ray_storage: Any
) -> None:
    """The train driver's spec and snapshot checks, evaluation's output, a Serve replica's checkpoint load."""
    import ray.train  # noqa: F401  (imported by local_copy; seconds, outside the timed calls)
    from tpuflow_driver.deadline_fs import StorageStalled

    with workloads_importable():
        from addition.checkpoint import local_copy
    proxy.add(Rule("stall", any_request))
    uri = f"gs://{bucket}/run/train/spec.json"
    _raises_within(lambda: ray_storage.read_text(uri), StorageStalled, f"get_file_info {uri}")
    _raises_within(lambda: ray_storage.exists(uri), StorageStalled, uri)
    _raises_within(lambda: ray_storage.write_text(uri, "{}"), StorageStalled, f"gs://{bucket}/run/train")

    def load() -> None:
        with local_copy(f"gs://{bucket}/run/train/checkpoint_000001"):
            pass

    _raises_within(load, StorageStalled, f"gs://{bucket}/run/train/checkpoint_000001")


def test_the_deadline_filesystem_works_as_the_plain_one_and_travels(
    bucket: str, ray_storage: Any, checkpoint_dir: Path, tmp_path: Path
) -> None:
    """What Ray Train does with it: upload, list, download, delete; it is pickled to every worker."""
    import pyarrow.fs as pafs

    fs, path = ray_storage.resolve_with_deadline(f"gs://{bucket}/runs/train/")
    assert fs.type_name == "py::gcs" and path == f"{bucket}/runs/train"
    fs = pickle.loads(pickle.dumps(fs))
    fs.create_dir(f"{path}/checkpoint_000001")
    pafs.copy_files(str(checkpoint_dir), f"{path}/checkpoint_000001", destination_filesystem=fs)
    infos = fs.get_file_info(pafs.FileSelector(f"{path}/checkpoint_000001"))
    assert sorted((Path(i.path).name, i.size) for i in infos) == [("meta.json", 12), ("state.msgpack", 300_000)]
    (tmp_path / "back").mkdir()
    pafs.copy_files(f"{path}/checkpoint_000001", str(tmp_path / "back"), source_filesystem=fs)
    assert (tmp_path / "back" / "state.msgpack").read_bytes() == (checkpoint_dir / "state.msgpack").read_bytes()
    with fs.open_input_file(f"{path}/checkpoint_000001/meta.json") as f:
        assert f.size() == 12 and f.read() == b'{"step": 50}'
    assert ray_storage.uri(fs, f"{path}/checkpoint_000001") == f"gs://{bucket}/runs/train/checkpoint_000001"
    fs.delete_dir_contents(f"{path}/checkpoint_000001")
    assert list_bucket(bucket, "runs/train/checkpoint_000001/") == []
    local, _ = ray_storage.resolve_with_deadline(str(tmp_path))
    assert local.type_name == "local"  # only GCS is wrapped


def test_a_deadline_that_is_not_a_number_is_refused(monkeypatch: pytest.MonkeyPatch, ray_storage: Any) -> None:
    from tpuflow_driver.deadline_fs import request_timeout_s

    from tpuflow.errors import UserInputError
    from tpuflow.storage import request_timeout

    monkeypatch.setenv("TPUFLOW_GCS_REQUEST_TIMEOUT_S", "soon")
    with pytest.raises(UserInputError, match="TPUFLOW_GCS_REQUEST_TIMEOUT_S='soon' is invalid: give a positive"):
        request_timeout()
    with pytest.raises(ValueError, match="TPUFLOW_GCS_REQUEST_TIMEOUT_S='soon' is not a positive number"):
        request_timeout_s()
    monkeypatch.delenv("TPUFLOW_GCS_REQUEST_TIMEOUT_S")
    assert request_timeout() == request_timeout_s() == 60.0


# --- the Ray side: parquet (prep's writes, Ray Data's reads in train and evaluate) -------------------


def _table(rows: int = 30_000) -> Any:
    """Rows shaped like prep's, a few row groups' worth."""
    import pyarrow as pa

    return pa.table({
        "problem_id": list(range(rows)),
        "prompt": [f"{i % 997}+{i % 89}=" for i in range(rows)],
        "answer": [str(i % 997 + i % 89) for i in range(rows)],
    })  # fmt: skip


def _object_reads(fragment: str) -> Any:
    """Rule matcher: downloads of objects whose name has `fragment` (not listings or metadata)."""
    return lambda method, target: method == "GET" and "alt=media" in target and fragment in target


def _bounded(fn: Any) -> Any:
    """fn() on a helper thread: a call that waits on a stalled server past WITHIN_S fails the test, not hangs it
    (such a thread stays blocked until the proxy stops)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WITHIN_S + 1.0)
    if thread.is_alive():
        pytest.fail(f"still waiting on the stalled server after {WITHIN_S + 1.0:g} s: no deadline on this call")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_a_parquet_write_to_a_stalled_server_fails_naming_the_path(
    bucket: str, proxy: FaultProxy, ray_storage: Any
) -> None:
    """What Ray Data's write_parquet does per block (pyarrow.dataset.write_dataset) and a plain write_table."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq
    from tpuflow_driver.deadline_fs import StorageStalled

    proxy.add(Rule("stall", writes_to("prep/")))
    fs, path = ray_storage.resolve_with_deadline(f"gs://{bucket}/prep/train")
    table = _table()
    _raises_within(
        lambda: pq.write_table(table, f"{path}/part-0.parquet", filesystem=fs, row_group_size=10_000),
        StorageStalled,
        f"gs://{bucket}/prep/train/part-0.parquet",
        f"within {DEADLINE_S:g} s (TPUFLOW_GCS_REQUEST_TIMEOUT_S)",
    )
    _raises_within(
        lambda: pads.write_dataset(
            table, path, format="parquet", filesystem=fs, basename_template="block-{i}.parquet",
            existing_data_behavior="overwrite_or_ignore", use_threads=True, max_rows_per_group=10_000,
            create_dir=False,  # Ray Data's driver made the folder: the block's own file stalls
        ),
        StorageStalled,
        f"gs://{bucket}/prep/train/block-0.parquet",
    )  # fmt: skip
    assert len(proxy.injected) >= 2, proxy.injected


def test_a_parquet_read_from_a_stalled_server_fails_naming_the_path(
    bucket: str, proxy: FaultProxy, ray_storage: Any
) -> None:
    """Ray Data's read_parquet reads through pyarrow.dataset: the listing answers, the file's bytes do not."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq
    from tpuflow_driver.deadline_fs import StorageStalled

    fs, path = ray_storage.resolve_with_deadline(f"gs://{bucket}/prep/heldout")
    pq.write_table(_table(), f"{path}/part-0.parquet", filesystem=fs, row_group_size=10_000)
    proxy.add(Rule("stall", _object_reads("prep/heldout/part-0.parquet")))
    _raises_within(  # discovery reads the file's footer
        lambda: pads.dataset(path, filesystem=fs, format="parquet").to_table(columns=["prompt", "answer"]),
        StorageStalled,
        f"gs://{bucket}/prep/heldout/part-0.parquet",
    )
    assert proxy.injected, "the read reached the server"


def test_parquet_through_the_deadline_filesystem_is_the_same_as_through_the_plain_one(
    bucket: str, ray_storage: Any
) -> None:
    """Byte for byte: the deadline filesystem gathers a writer's small writes before handing them on."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    table = _table(120_000)  # files over 1 MiB: the gathered writes are handed on more than once
    files = {}
    for name, resolve in (("plain", ray_storage.resolve), ("deadline", ray_storage.resolve_with_deadline)):
        fs, path = resolve(f"gs://{bucket}/{name}")
        pq.write_table(table, f"{path}/part-0.parquet", filesystem=fs, row_group_size=20_000)
        pads.write_dataset(table, f"{path}/ds", format="parquet", filesystem=fs, basename_template="b-{i}.parquet",
                           max_rows_per_group=20_000, use_threads=True)  # fmt: skip
        files[name] = fs
    plain, deadline = files["plain"], files["deadline"]
    assert deadline.type_name == "py::gcs" and plain.type_name == "gcs"
    for rel in ("part-0.parquet", "ds/b-0.parquet"):
        with (
            plain.open_input_stream(f"{bucket}/plain/{rel}") as a,
            plain.open_input_stream(f"{bucket}/deadline/{rel}") as b,
        ):
            written = b.read()
            assert written == a.read() and len(written) > 1024 * 1024, rel
    for fs in (plain, deadline):
        back = pads.dataset(f"{bucket}/deadline", filesystem=fs, format="parquet", exclude_invalid_files=True)
        assert back.to_table().num_rows == 2 * table.num_rows
        meta = pq.ParquetFile(f"{bucket}/deadline/part-0.parquet", filesystem=fs).metadata
        assert meta.num_row_groups == 6
    got = pads.dataset(f"{bucket}/plain/part-0.parquet", filesystem=deadline, format="parquet").to_table()
    assert got.equals(table)


def test_prep_counts_its_rows_with_the_deadline(bucket: str, proxy: FaultProxy, ray_storage: Any) -> None:
    """Prep checks what it wrote from the files' footers: a stalled server fails that check in time."""
    from tpuflow_driver.deadline_fs import StorageStalled

    with workloads_importable():
        from addition import prep
    proxy.add(Rule("stall", any_request))
    uri = f"gs://{bucket}/data/train"
    _raises_within(lambda: _bounded(lambda: prep._count_rows(uri)), StorageStalled, uri)


class _ReadRecorded(Exception):
    """Stops a driver right after it handed Ray Data its filesystem."""


def test_train_and_evaluate_give_ray_data_the_deadline_filesystem(
    bucket: str, ray_storage: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the train and evaluate drivers pass to ray.data.read_parquet (no Ray cluster: the read is stopped)."""
    import ray.data
    from tpuflow_driver.deadline_fs import DeadlineHandler

    with workloads_importable():
        from addition import checkpoint as ckpt
        from addition.evaluate import evaluate
        from addition.training import model_config, resolve_config
        from tpuflow_driver.train import TrainSpec, build_trainer
    given: list[tuple[str, Any]] = []

    def read_parquet(path: str, *, filesystem: Any, **_: Any) -> Any:
        given.append((path, filesystem))
        raise _ReadRecorded

    monkeypatch.setattr(ray.data, "read_parquet", read_parquet)
    spec = TrainSpec("jax", "json:dumps", "run", f"gs://{bucket}/runs", {"num_workers": 1},
                     datasets={"train": f"gs://{bucket}/data/train"})  # fmt: skip
    with pytest.raises(_ReadRecorded):
        build_trainer(spec)
    cfg, model = model_config(resolve_config({}))
    params = {k: np.zeros(shape, np.float32) for k, shape in ckpt.param_shapes(model).items()}
    ckpt.save(tmp_path / "checkpoint", ckpt.Meta("jax", 0, 0, model, cfg), params)
    with pytest.raises(_ReadRecorded):
        evaluate(str(tmp_path / "checkpoint"), "jax", f"gs://{bucket}/data/heldout")
    assert [path for path, _ in given] == [f"{bucket}/data/train", f"{bucket}/data/heldout"]
    for _, fs in given:
        assert fs.type_name == "py::gcs" and isinstance(fs.handler, DeadlineHandler), fs.type_name
        assert fs.handler.seconds == DEADLINE_S


# --- the Airflow side: google-cloud-storage --------------------------------------------------------


def test_airflow_side_calls_to_a_stalled_server_raise_storage_timeout(bucket: str, proxy: FaultProxy) -> None:
    from tpuflow.storage import StorageTimeout, check_writable, read_text, write_text

    proxy.add(Rule("stall", any_request))
    uri = f"gs://{bucket}/r/report.json"
    said = ("sent no complete answer within 1 s (TPUFLOW_GCS_REQUEST_TIMEOUT_S)", f"the GCS emulator at {proxy.url}")
    _raises_within(lambda: write_text(uri, "{}"), StorageTimeout, f"writing {uri}", *said)
    _raises_within(lambda: read_text(uri), StorageTimeout, f"reading {uri}", *said)
    _raises_within(
        lambda: check_writable(f"gs://{bucket}/r"), StorageTimeout, f"gs://{bucket}/r/.tpuflow-write-check-", *said
    )
    # google-cloud-storage also reads the bucket's metadata, on a background thread of its own (10 s timeout)
    calls = [target for _, target, _ in proxy.injected if not target.startswith(f"/storage/v1/b/{bucket}?")]
    assert len(calls) == 3, f"a request that got no answer is not retried: {calls}"


def test_a_job_failed_by_a_stalled_upload_is_infrastructure_not_user_code(ray_storage: Any) -> None:
    """The task retries per its policy: a stalled storage call is not a bug in the training code."""
    from tpuflow_driver.deadline_fs import StorageStalled, within

    from tpuflow.rayjob.failures import is_user_code_error

    with pytest.raises(StorageStalled) as caught:
        within(0.05, "open_output_stream", "gs://b/run/checkpoint_000001/state.bin", time.sleep, 5)
    tail = f"Traceback (most recent call last):\n  ...\n{type(caught.value).__name__}: {caught.value}"
    assert not is_user_code_error("FAILED", "Job entrypoint command failed with exit code 1", tail)
