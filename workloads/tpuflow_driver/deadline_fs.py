"""A pyarrow filesystem whose every call has a deadline: what every storage call of the Ray jobs goes through.

pyarrow's GcsFileSystem bounds retries (`retry_time_limit`), not a request that never returns: against a
server that accepts the connection and sends nothing, one call blocks forever (measured with pyarrow 26:
`get_file_info` still waiting after 60 s with retry_time_limit=5 s), and pyarrow's GcsOptions have no
request or stall timeout to set. Ray Train's checkpoint upload then only logs "has been running for ...s"
while the slice stays held. Here each call (a metadata call, an open, one write, one read, a close) runs on
a helper thread and the caller waits at most TPUFLOW_GCS_REQUEST_TIMEOUT_S seconds; past it the call
raises StorageStalled naming the path, so the upload, write or read fails, and Ray Train's FailureConfig,
Ray Data's task retries, then the Airflow task's retries decide what happens next. The stalled helper
thread cannot be cancelled: it is a daemon thread, gone with the process.

Wrapped (tpuflow_driver.storage.resolve_with_deadline): Ray Train's filesystem, prep's parquet writes and
row count, Ray Data's parquet reads (train and evaluate), the checkpoints evaluation and Serve replicas load,
the drivers' small files. Two things keep it cheap (bench: storage_deadline_overhead): a parquet writer's
small writes are gathered into 1 MiB ones (one thread hand-off each, not one per page), and a random-access
read downloads the object once as a stream (see _WholeFile for why pyarrow's own random-access GCS file
cannot be given a deadline).
"""

from __future__ import annotations

import os
import tempfile
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
    """A file object over one of the wrapped filesystem's streams (an input or an output stream), each call
    with the deadline.

    Small writes (a parquet writer's pages, hundreds per file) are gathered here into WRITE_CHUNK-sized
    writes: the GCS stream buffers them in memory anyway, and each call through the deadline costs a
    thread hand-off. `closed` is kept here rather than asked of the native stream."""

    WRITE_CHUNK = 1 << 20

    def __init__(self, inner: pa.NativeFile, where: str, seconds: float, mode: str) -> None:
        self._inner, self._where, self._seconds, self._mode = inner, where, seconds, mode
        self._pending = bytearray()
        self._closed = False

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        return within(self._seconds, what, self._where, fn, *args)

    @property
    def closed(self) -> bool:
        return self._closed

    def readable(self) -> bool:
        return self._mode == "r"

    def writable(self) -> bool:
        return self._mode == "w"

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._inner.tell() + len(self._pending)

    def read(self, nbytes: int | None = None) -> bytes:
        return self._call("read", self._inner.read, nbytes)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if not self._pending and len(view) >= self.WRITE_CHUNK:
            return self._call("write", self._inner.write, data)
        self._pending += view
        if len(self._pending) >= self.WRITE_CHUNK:
            self._write_pending()
        return len(view)

    def _write_pending(self) -> None:
        if self._pending:
            self._call("write", self._inner.write, bytes(self._pending))
            self._pending.clear()

    def flush(self) -> None:
        self._write_pending()
        self._call("flush", self._inner.flush)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._write_pending()
            self._call("close", self._inner.close)


class _WholeFile:
    """A random-access file on GCS, read as one stream (DOWNLOAD_CHUNK bytes per call, each with the deadline)
    into a local spool on its first read; seeks and reads are then served from the spool.

    Not pyarrow's own random-access GCS file: with pyarrow 26, every Python call on it first asks `closed`,
    which starts the object's download and waits for the server's answer while holding the GIL, so a
    stalled server freezes the whole process (until the GCS client gives up, minutes later) and no deadline
    can fire. Its input stream does not: it opens the download in `open` (without the GIL). The cost: the
    whole object is read even when the reader wants a few columns of it."""

    DOWNLOAD_CHUNK = 8 << 20
    IN_MEMORY = 64 << 20  # a bigger file spools to a temporary file on disk

    def __init__(self, fs: pafs.FileSystem, path: str, size: int, where: str, seconds: float) -> None:
        self._fs, self._path, self._size, self._where, self._seconds = fs, path, size, where, seconds
        self._spool: Any = None
        self._pos = 0
        self._closed = False

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        return within(self._seconds, what, self._where, fn, *args)

    def _download(self) -> Any:
        if self._spool is None:
            spool = tempfile.SpooledTemporaryFile(max_size=self.IN_MEMORY)
            stream = self._call("open_input_stream", self._fs.open_input_stream, self._path)
            try:
                while chunk := self._call("read", stream.read, self.DOWNLOAD_CHUNK):
                    spool.write(chunk)
            finally:
                self._call("close", stream.close)
            self._spool = spool
        return self._spool

    @property
    def closed(self) -> bool:
        return self._closed

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def seek(self, position: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._size}[whence] + position
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, nbytes: int | None = None) -> bytes:
        spool = self._download()
        spool.seek(self._pos)
        data = spool.read(-1 if nbytes is None or nbytes < 0 else nbytes)
        self._pos += len(data)
        return data

    def close(self) -> None:
        self._closed = True
        if self._spool is not None:
            self._spool.close()


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

    def _stream(self, native: pa.NativeFile, path: str, mode: str) -> pa.PythonFile:
        return pa.PythonFile(_Stream(native, self._where(path), self.seconds, mode), mode=mode)

    def open_input_stream(self, path: str) -> pa.PythonFile:
        return self._stream(self._call("open_input_stream", path, self.inner.open_input_stream, path), path, "r")

    def open_input_file(self, path: str) -> pa.PythonFile:
        info = self._call("open_input_file", path, self.inner.get_file_info, path)
        if info.type != pafs.FileType.File:
            what = "is a directory" if info.type == pafs.FileType.Directory else "does not exist"
            raise FileNotFoundError(f"{self._where(path)} {what}")
        return pa.PythonFile(_WholeFile(self.inner, path, info.size, self._where(path), self.seconds), mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> pa.PythonFile:
        opened = self._call("open_output_stream", path, self.inner.open_output_stream, path, None, None, metadata)
        return self._stream(opened, path, "w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.PythonFile:
        opened = self._call("open_append_stream", path, self.inner.open_append_stream, path, None, None, metadata)
        return self._stream(opened, path, "w")


def with_deadline(fs: pafs.FileSystem, seconds: float | None = None) -> pafs.FileSystem:
    """`fs` with every call bounded by `seconds` (default: request_timeout_s())."""
    return pafs.PyFileSystem(DeadlineHandler(fs, request_timeout_s() if seconds is None else seconds))
