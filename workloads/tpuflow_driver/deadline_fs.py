"""A pyarrow filesystem whose every call has a deadline: what Ray Train is given as its storage_filesystem.

pyarrow's GcsFileSystem bounds retries (`retry_time_limit`), not a request that never returns: against a
server that accepts the connection and sends nothing, one call blocks forever (measured with pyarrow 26:
`get_file_info` still waiting after 60 s with retry_time_limit=5 s), and pyarrow's GcsOptions have no
request or stall timeout to set. Ray Train's checkpoint upload then only logs "has been running for ...s"
while the slice stays held. Here each call (a metadata call, an open, one write, one read, a close) runs on
a helper thread and the caller waits at most TPUFLOW_GCS_REQUEST_TIMEOUT_S seconds; past it the call
raises StorageStalled naming the path, so the checkpoint upload fails, and Ray Train's FailureConfig (then
the task's retries) decide what happens next. The stalled helper thread cannot be cancelled: it is a
daemon thread, gone with the process when Ray Train tears its workers down.

Wrapped (tpuflow_driver.storage.resolve_with_deadline): Ray Train's filesystem, the checkpoints evaluation
and Serve replicas load, the drivers' small files. Not wrapped: prep's parquet writes and Ray Data's reads,
many small calls from pyarrow's own threads, where a Python hop per call costs too much.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

REQUEST_TIMEOUT_ENV = "TPUFLOW_GCS_REQUEST_TIMEOUT_S"
DEFAULT_REQUEST_TIMEOUT_S = 60.0
T = TypeVar("T")


class StorageStalled(OSError):
    """A storage call got no answer within its deadline.

    Not a TimeoutError: Ray's Checkpoint.to_directory takes any TimeoutError for its own file lock's and
    goes on with an empty folder."""


def request_timeout_s() -> float:
    """$TPUFLOW_GCS_REQUEST_TIMEOUT_S (default 60): the longest one storage call may wait for the server."""
    raw = os.environ.get(REQUEST_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_REQUEST_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:  # also NaN
        raise ValueError(f"{REQUEST_TIMEOUT_ENV}={raw!r} is not a positive number of seconds; set e.g. 60")
    return value


def within(seconds: float, what: str, where: str, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args), or StorageStalled naming `what` and `where` once `seconds` passed without an answer."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # handed to the caller as it is
            box["error"] = err
        finally:
            done.set()

    threading.Thread(target=run, name=f"storage {what}", daemon=True).start()
    if not done.wait(seconds):
        raise StorageStalled(
            f"storage call stalled: {what} {where} got no answer from the storage server within {seconds:g} s "
            f"({REQUEST_TIMEOUT_ENV}); the server accepts connections but does not answer"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Stream:
    """A file object over one of the wrapped filesystem's streams, each call with the deadline.

    A random-access file keeps its own position and reads with read_at: PythonFile finds a file's size
    by seeking to its end, which GCS's own file answers with HTTP 416."""

    def __init__(self, inner: pa.NativeFile, where: str, seconds: float, random_access: bool = False) -> None:
        self._inner, self._where, self._seconds = inner, where, seconds
        self._random, self._pos = random_access, 0

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        return within(self._seconds, what, self._where, fn, *args)

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def readable(self) -> bool:
        return self._inner.readable()

    def writable(self) -> bool:
        return self._inner.writable()

    def seekable(self) -> bool:
        return self._random

    def size(self) -> int:
        return self._call("size", self._inner.size)

    def seek(self, position: int, whence: int = 0) -> int:
        if not self._random:
            raise OSError(f"{self._where}: this stream is not seekable")
        base = {0: 0, 1: self._pos, 2: self.size() if whence == 2 else 0}[whence]
        self._pos = base + position
        return self._pos

    def tell(self) -> int:
        return self._pos if self._random else self._inner.tell()

    def read(self, nbytes: int | None = None) -> bytes:
        if not self._random:
            return self._call("read", self._inner.read, nbytes)
        if nbytes is None or nbytes < 0:
            nbytes = max(self.size() - self._pos, 0)
        data = self._call("read", self._inner.read_at, nbytes, self._pos)
        self._pos += len(data)
        return data

    def write(self, data: Any) -> int:
        return self._call("write", self._inner.write, data)

    def flush(self) -> None:
        self._call("flush", self._inner.flush)

    def close(self) -> None:
        if not self._inner.closed:
            self._call("close", self._inner.close)


class DeadlineHandler(pafs.FileSystemHandler):
    """Delegates every call to `inner` (a GcsFileSystem), each within `seconds`; picklable (Ray ships it)."""

    def __init__(self, inner: pafs.FileSystem, seconds: float) -> None:
        self.inner, self.seconds = inner, float(seconds)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeadlineHandler) and self.seconds == other.seconds and self.inner.equals(other.inner)

    def __hash__(self) -> int:
        return hash((self.inner.type_name, self.seconds))

    def _where(self, path: str) -> str:
        return f"gs://{path}" if self.inner.type_name == "gcs" else path

    def _call(self, what: str, path: str, fn: Callable[..., T], *args: Any) -> T:
        return within(self.seconds, what, self._where(path), fn, *args)

    def get_type_name(self) -> str:
        return self.inner.type_name

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self._call("get_file_info", ", ".join(paths), self.inner.get_file_info, paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self._call("list", selector.base_dir, self.inner.get_file_info, selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._call("create_dir", path, lambda: self.inner.create_dir(path, recursive=recursive))

    def delete_dir(self, path: str) -> None:
        self._call("delete_dir", path, self.inner.delete_dir, path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._call(
            "delete_dir_contents",
            path,
            lambda: self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok),
        )

    def delete_root_dir_contents(self) -> None:
        self._call("delete_root_dir_contents", "/", lambda: self.inner.delete_dir_contents("/", accept_root_dir=True))

    def delete_file(self, path: str) -> None:
        self._call("delete_file", path, self.inner.delete_file, path)

    def move(self, src: str, dest: str) -> None:
        self._call("move", f"{src} -> {dest}", self.inner.move, src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self._call("copy_file", f"{src} -> {dest}", self.inner.copy_file, src, dest)

    def _stream(self, native: pa.NativeFile, path: str, mode: str, random_access: bool = False) -> pa.PythonFile:
        return pa.PythonFile(_Stream(native, self._where(path), self.seconds, random_access), mode=mode)

    def open_input_stream(self, path: str) -> pa.PythonFile:
        return self._stream(self._call("open_input_stream", path, self.inner.open_input_stream, path), path, "r")

    def open_input_file(self, path: str) -> pa.PythonFile:
        opened = self._call("open_input_file", path, self.inner.open_input_file, path)
        return self._stream(opened, path, "r", random_access=True)

    def open_output_stream(self, path: str, metadata: Any) -> pa.PythonFile:
        opened = self._call("open_output_stream", path, self.inner.open_output_stream, path, None, None, metadata)
        return self._stream(opened, path, "w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.PythonFile:
        opened = self._call("open_append_stream", path, self.inner.open_append_stream, path, None, None, metadata)
        return self._stream(opened, path, "w")


def with_deadline(fs: pafs.FileSystem, seconds: float | None = None) -> pafs.FileSystem:
    """`fs` with every call bounded by `seconds` (default: request_timeout_s())."""
    return pafs.PyFileSystem(DeadlineHandler(fs, request_timeout_s() if seconds is None else seconds))
