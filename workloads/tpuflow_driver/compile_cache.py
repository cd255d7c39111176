"""Warm starts: JAX's persistent compilation cache in a folder under the run's storage.

A retried attempt, a resumed run or tomorrow's run of the same pipeline compiles the same programs for the
same slice: with the cache they are read back instead (on a TPU v5e chip the demo's first step took 4.4 s
cold and 1.1 s warm; a 25 M-parameter model's 24-27 s and 5.9 s; issue 49). The driver wraps the train loop
(`wrap`) so every worker turns the cache on before the loop's first line; the loop itself changes nothing.

The folder is ``<storage_path>/jax-compilation-cache/<slice shape>/jax-<v>_jaxlib-<v>_libtpu-<v>``: the
slice shape comes from the driver's ScalingConfig, the versions from the worker's own installation (never
from the driver's), so two versions never share a folder (JAX's own cache key would keep their entries
apart anyway; separate folders keep one version's entries from outliving it unseen). gs:// folders are read
and written by JAX itself (etils.epath). Only programs that took at least ``min_compile_s`` to compile are
written (JAX's default, 1 s: what is worth reading back); TPUFLOW_COMPILATION_CACHE_MIN_COMPILE_S overrides
it on the workers (0: every program, as the CPU tests do).

jax is imported only inside functions: the driver imports this module to wrap the loop.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

FOLDER = "jax-compilation-cache"
MIN_COMPILE_ENV = "TPUFLOW_COMPILATION_CACHE_MIN_COMPILE_S"
DEFAULT_MIN_COMPILE_S = 1.0
_LIBTPU_DISTS = ("libtpu", "libtpu-nightly")


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "none"


def slice_shape(scaling_config: Mapping[str, Any]) -> str:
    """The slice the workers run on, from the driver's ScalingConfig kwargs (no device is touched)."""
    accelerator, topology = scaling_config.get("accelerator_type"), scaling_config.get("topology")
    if accelerator or topology:
        shape = f"{accelerator or 'tpu'}-{topology or 'any'}"
    else:
        shape = "cpu"
    workers = int(scaling_config.get("num_workers") or 1)
    return _clean(f"{shape}-{workers}w")


def versions() -> dict[str, str | None]:
    """This process's jax, jaxlib and libtpu versions (libtpu None where it is not installed)."""
    out: dict[str, str | None] = {}
    for dist in ("jax", "jaxlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["libtpu"] = None
    for dist in _LIBTPU_DISTS:
        try:
            out["libtpu"] = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    return out


def version_key(found: Mapping[str, str | None] | None = None) -> str:
    v = versions() if found is None else found
    return _clean(f"jax-{v.get('jax')}_jaxlib-{v.get('jaxlib')}_libtpu-{v.get('libtpu')}")


def base_folder(storage_path: str, scaling_config: Mapping[str, Any]) -> str:
    """Where the workers of this slice shape keep their cache (one folder per version below it)."""
    root = storage_path if "://" in storage_path else os.path.abspath(os.path.expanduser(storage_path))
    return "/".join([root.rstrip("/"), FOLDER, slice_shape(scaling_config)])


def enable(base: str, min_compile_s: float | None = None) -> str:
    """Turn the persistent cache on in ``base/<version key>`` for this process; returns that folder."""
    import jax

    folder = "/".join([base.rstrip("/"), version_key()])
    if "://" not in folder:
        os.makedirs(folder, exist_ok=True)
    if min_compile_s is None:
        min_compile_s = float(os.environ.get(MIN_COMPILE_ENV, DEFAULT_MIN_COMPILE_S))
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def wrap(loop: Callable[..., Any], base: str) -> Callable[..., Any]:
    """``loop`` with the cache turned on first, taking the same arguments (none, or the config)."""
    if not inspect.signature(loop).parameters:

        def loop_without_config() -> Any:
            enable(base)
            return loop()

        return loop_without_config

    def loop_with_config(config: dict[str, Any]) -> Any:
        enable(base)
        return loop(config)

    return loop_with_config
