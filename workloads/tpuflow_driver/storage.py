"""Paths that may be local or remote (gs://...), through pyarrow's filesystems.

`resolve` is the one place a path becomes (filesystem, path) for every pyarrow user in the Ray jobs
(through `resolve_with_deadline`): prep's parquet writes, Ray Data reads, Ray Train's
RunConfig(storage_filesystem=...), evaluation output and the checkpoints Serve replicas load. gs:// goes through GcsFileSystem built here, so it
honours STORAGE_EMULATOR_HOST (pyarrow's own FileSystem.from_uri ignores that variable and hangs
looking for real credentials) and carries the retry limit for transient GCS errors (429, 5xx,
connection resets), which the GCS client applies with exponential backoff.

The retry limit does not bound a request that never returns, and pyarrow offers no request timeout:
`resolve_with_deadline` wraps the GCS filesystem so that each call fails past TPUFLOW_GCS_REQUEST_TIMEOUT_S
naming the path (tpuflow_driver.deadline_fs). Every storage call of the Ray jobs goes through it: Ray
Train's storage_filesystem (whose checkpoint uploads otherwise wait forever on a stalled server), prep's
parquet writes and row count, Ray Data's reads in train and evaluate, the checkpoints evaluation and Serve
replicas load, and the small files below. `resolve` itself is what it wraps.
"""

from __future__ import annotations

import datetime as dt
import os

import pyarrow.fs as pafs
from tpuflow_driver.deadline_fs import with_deadline

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
# How long the GCS client keeps retrying one transient failure (its own backoff) before it fails.
GCS_RETRY_LIMIT = dt.timedelta(seconds=float(os.environ.get("TPUFLOW_GCS_RETRY_LIMIT_S", "300")))


def normalize(path: str) -> str:
    """Absolute local path, or the URI unchanged (a job's cwd is its uploaded working_dir)."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def gcs_filesystem() -> pafs.GcsFileSystem:
    """GCS through pyarrow: the emulator at $STORAGE_EMULATOR_HOST (anonymous, its own scheme), else
    Google's endpoint with the default credentials."""
    host = os.environ.get(EMULATOR_ENV, "").strip().rstrip("/")
    if not host:
        return pafs.GcsFileSystem(retry_time_limit=GCS_RETRY_LIMIT)
    scheme, sep, address = host.partition("://")
    if not sep:
        scheme, address = "http", host
    return pafs.GcsFileSystem(
        anonymous=True, scheme=scheme, endpoint_override=address, retry_time_limit=GCS_RETRY_LIMIT
    )


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path on it) for a local path or URI; gs://BUCKET/OBJECT becomes (GCS, "BUCKET/OBJECT")."""
    path = normalize(path)
    if path.startswith("gs://"):
        return gcs_filesystem(), path[len("gs://") :].rstrip("/")
    return pafs.FileSystem.from_uri(path)


def resolve_with_deadline(path: str) -> tuple[pafs.FileSystem, str]:
    """`resolve`, with every call on GCS bounded by TPUFLOW_GCS_REQUEST_TIMEOUT_S (its type_name is then
    "py::gcs"); a local path resolves as `resolve` does."""
    fs, fs_path = resolve(path)
    return (with_deadline(fs) if fs.type_name == "gcs" else fs), fs_path


def uri(fs: pafs.FileSystem, path: str) -> str:
    """The URI of `path` on `fs` (Ray Train's Checkpoint.path, for one, drops the scheme)."""
    return f"gs://{path}" if fs.type_name in ("gcs", "py::gcs") and "://" not in path else path


def exists(path: str) -> bool:
    fs, p = resolve_with_deadline(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def read_text(path: str) -> str | None:
    fs, p = resolve_with_deadline(path)
    if fs.get_file_info(p).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(p) as f:
        return f.read().decode()


def write_text(path: str, text: str) -> None:
    fs, p = resolve_with_deadline(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(p) as f:
        f.write(text.encode())


def delete(path: str) -> None:
    """Remove a file or directory tree if present."""
    fs, p = resolve_with_deadline(path)
    info = fs.get_file_info(p)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir_contents(p, missing_dir_ok=True)
        if fs.get_file_info(p).type == pafs.FileType.Directory:  # on GCS a folder may be only a prefix
            fs.delete_dir(p)
    elif info.type == pafs.FileType.File:
        fs.delete_file(p)


def quiet_ray_data() -> None:
    """No progress bars from Ray Data: in a job log they are thousands of redrawn lines."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
