"""Paths that may be local or remote (gs://...), through pyarrow's filesystems."""

from __future__ import annotations

import os

import pyarrow.fs as pafs


def normalize(path: str) -> str:
    """Absolute local path, or the URI unchanged (a job's cwd is its uploaded working_dir)."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(normalize(path))


def exists(path: str) -> bool:
    fs, p = resolve(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def read_text(path: str) -> str | None:
    fs, p = resolve(path)
    if fs.get_file_info(p).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(p) as f:
        return f.read().decode()


def write_text(path: str, text: str) -> None:
    fs, p = resolve(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(p) as f:
        f.write(text.encode())


def delete(path: str) -> None:
    """Remove a file or directory tree if present."""
    fs, p = resolve(path)
    info = fs.get_file_info(p)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(p)
    elif info.type == pafs.FileType.File:
        fs.delete_file(p)


def quiet_ray_data() -> None:
    """No progress bars from Ray Data: in a job log they are thousands of redrawn lines."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
