"""A Ray Train run's result read from Ray Train's own record of the run, on the Airflow side.

A team's own training script (its TorchTrainer/JaxTrainer with RunConfig(storage_path=..., name=...)) prints no
TPUFLOW_RESULT line; Ray Train still keeps the run's checkpoints and the metrics reported with them in the run
folder (checkpoint_manager_snapshot.json), and reads them back with its public ``Result.from_path``.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from typing import Any, cast

from tpuflow.rayjob.failures import UserInputFailure
from tpuflow.storage import emulator_host, request_timeout

FIELD = "train_run_path"
SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train v2's CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
_FIX = (
    "give the folder the job's Ray Train run writes (RunConfig storage_path + '/' + name; gs:// when the cluster "
    "does not share this machine's disk) and report at least one checkpoint from the train loop "
    "(ray.train.report(metrics, checkpoint=...))"
)


def _filesystem(path: str) -> tuple[Any, str]:
    """(pyarrow filesystem, path on it); gs:// honours STORAGE_EMULATOR_HOST as the jobs' own
    tpuflow_driver.storage.gcs_filesystem does (pyarrow's from_uri ignores it). That module lives with the
    workloads, which the operators cannot import, so its few lines are repeated here."""
    import pyarrow.fs as pafs

    if not path.startswith("gs://"):
        # pyarrow is untyped here: from_uri gives (FileSystem, path on it)
        return cast("tuple[Any, str]", pafs.FileSystem.from_uri(path if "://" in path else f"file://{path}"))
    retry = dt.timedelta(seconds=request_timeout())
    fs_path = path[len("gs://") :].rstrip("/")
    host = (emulator_host() or "").rstrip("/")
    if not host:
        return pafs.GcsFileSystem(retry_time_limit=retry), fs_path
    scheme, sep, address = host.partition("://")
    if not sep:
        scheme, address = "http", host
    return pafs.GcsFileSystem(anonymous=True, scheme=scheme, endpoint_override=address, retry_time_limit=retry), fs_path


def read_train_result(train_run_path: str) -> dict[str, Any]:
    """The run's latest checkpoint (a gs:// URI when the run is on GCS) and the metrics reported with it.

    A folder without Ray Train's snapshot, or whose snapshot records no checkpoint, raises UserInputFailure
    (fails the task without retries: the same script writes the same folder again)."""

    import pyarrow.fs as pafs

    path = train_run_path.rstrip("/") if "://" in train_run_path else os.path.abspath(train_run_path)
    fs, fs_path = _filesystem(path)
    if fs.get_file_info(f"{fs_path}/{SNAPSHOT}").type != pafs.FileType.File:
        raise UserInputFailure(FIELD, train_run_path, f"the folder holds no Ray Train run ({SNAPSHOT}): {_FIX}")
    from ray.train.v2.api.result import Result

    # Loading the snapshot logs Ray Train's advice for a trainer about to resume (use a new RunConfig name or
    # delete the folder), which would mislead in the task log of a job that just succeeded.
    quiet = logging.getLogger("ray.train.v2._internal.execution.checkpoint.checkpoint_manager")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        result = Result.from_path(fs_path, storage_filesystem=fs)
    finally:
        quiet.setLevel(level)
    if result.checkpoint is None:
        raise UserInputFailure(FIELD, train_run_path, f"the Ray Train run recorded no checkpoint: {_FIX}")
    checkpoint = result.checkpoint.path  # Checkpoint.path drops the URI scheme of remote storage
    return {
        "checkpoint": f"gs://{checkpoint}" if path.startswith("gs://") else checkpoint,
        "metrics": dict(result.metrics or {}),
        FIELD: train_run_path,
    }
