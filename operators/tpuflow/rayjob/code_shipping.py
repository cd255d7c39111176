"""The user's code as Ray ships it with a job: checked before submitting, the project's driver beside it.

Ray's ``JobSubmissionClient.submit_job`` packs a local ``working_dir`` and every local ``py_modules``
entry into a zip and uploads it to the dashboard. What goes wrong there (a path that is not on this
machine, a single ``.py`` file, which the SDK packs as if it were a folder and fails on, a package
larger than the dashboard accepts) surfaced as an error of the submission, retried like lost
infrastructure. ``check_code_shipping`` runs Ray's own upload steps (``upload_working_dir_if_needed``,
``upload_py_modules_if_needed``: its URI, archive and type rules) with an upload function that
measures instead of uploading, and turns each problem into a ``UserInputFailure`` (no retry) naming
the field, the value and the fix. Ray is pinned (2.60): the private helpers used here are its own.

``with_driver`` puts ``tpuflow_driver`` (the training / preflight driver and the result helper)
beside the user's code: as a ``py_modules`` entry whenever the working_dir is not the workloads
folder that already holds it, so the user's folder stays the job's working directory.
"""

from __future__ import annotations

import keyword
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from tpuflow import workloads_dir
from tpuflow.rayjob.failures import UserInputFailure

DRIVER_PACKAGE = "tpuflow_driver"
PY_MODULES_FIELD = "runtime_env['py_modules']"
# Per zip entry beyond the file's bytes (Ray writes stored, uncompressed entries): local header (30)
# and central directory record (46) plus extra fields; the name is counted on top, twice.
_ZIP_ENTRY_BYTES = 200
_log = logging.getLogger(__name__)


class _Problem(Exception):
    """Raised from inside Ray's upload step: the fix for the value being shipped."""


def driver_dir() -> Path:
    return Path(workloads_dir()) / DRIVER_PACKAGE


def max_package_bytes() -> int:
    """The largest package a job submission can upload: the dashboard's request size limit
    (aiohttp's client_max_size) and Ray's GCS storage limit, whichever is smaller."""
    from ray._private.ray_constants import DASHBOARD_CLIENT_MAX_SIZE
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE

    return min(DASHBOARD_CLIENT_MAX_SIZE, GCS_STORAGE_MAX_SIZE - 1)


def with_driver(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with the project's driver package importable by the job's driver and workers.

    The workloads folder holds the driver; any other working_dir (the user's code, a URI, none)
    gets it as one more ``py_modules`` entry, after the user's own."""
    env = dict(runtime_env)
    if _is_workloads(env.get("working_dir")):
        return env
    modules = env.get("py_modules")
    if modules is not None and not isinstance(modules, list):
        return env  # check_code_shipping names it
    modules = list(modules or [])
    if not any(_same_path(m, driver_dir()) for m in modules):
        modules.append(str(driver_dir()))
    env["py_modules"] = modules
    return env


def check_code_shipping(
    runtime_env: Mapping[str, Any], *, working_dir_field: str = "working_dir", logger: logging.Logger | None = None
) -> None:
    """Raise ``UserInputFailure`` for a working_dir or py_modules entry Ray's job submission would
    refuse or could not make importable, before anything is submitted."""
    include_gitignore = _include_gitignore()
    log = logger or _log
    working_dir = runtime_env.get("working_dir")
    if working_dir is not None:
        _check_working_dir(working_dir, runtime_env, working_dir_field, include_gitignore, log)
    modules = runtime_env.get("py_modules")
    if modules is None:
        return
    if not isinstance(modules, list):
        raise UserInputFailure(PY_MODULES_FIELD, modules, "give a list of package folders, .whl files or URIs")
    for index, module in enumerate(modules):
        _check_py_module(f"{PY_MODULES_FIELD}[{index}]", module, runtime_env, include_gitignore, log)


def _check_working_dir(
    value: Any, runtime_env: Mapping[str, Any], field: str, include_gitignore: bool, log: logging.Logger
) -> None:
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    path = _local_path(value)
    if path is not None and not path.exists():
        raise UserInputFailure(
            field,
            value,
            "no such folder on the machine that submits the job; give your code's folder, a .zip / .tar.gz "
            "archive of it, or a remote URI such as gs://bucket/code.zip",
        )
    if path is not None and path.is_dir() and not _is_workloads(value):
        for name in (DRIVER_PACKAGE, f"{DRIVER_PACKAGE}.py"):
            if (path / name).exists():
                raise UserInputFailure(field, value, _shadow_fix(name))
    env = {"working_dir": value, "excludes": runtime_env.get("excludes")}
    _run_ray_step(field, value, upload_working_dir_if_needed, env, include_gitignore, log, package=False)


def _check_py_module(
    field: str, value: Any, runtime_env: Mapping[str, Any], include_gitignore: bool, log: logging.Logger
) -> None:
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    path = _local_path(value) if isinstance(value, str | Path) else None
    if path is not None:
        if not path.exists():
            raise UserInputFailure(
                field,
                value,
                "no such file or folder on the machine that submits the job; give your package's folder (the "
                "one holding __init__.py), a .whl file, or a remote URI such as gs://bucket/pkg.zip",
            )
        if path.stem == DRIVER_PACKAGE and not _same_path(path, driver_dir()):
            raise UserInputFailure(field, value, _shadow_fix(path.name))
        if path.is_file() and path.suffix not in (".py", ".whl"):  # Ray would name .py as allowed: it is not
            raise UserInputFailure(
                field,
                value,
                "a local py_modules file must be a .whl; give the package's folder or a .whl, or upload the "
                "archive and give its URI (gs://bucket/pkg.zip)",
            )
    env = {"py_modules": [value], "excludes": runtime_env.get("excludes")}
    _run_ray_step(field, value, upload_py_modules_if_needed, env, include_gitignore, log, package=True)


def _run_ray_step(
    field: str,
    value: Any,
    step: Callable[..., Any],
    env: dict[str, Any],
    include_gitignore: bool,
    log: logging.Logger,
    *,
    package: bool,
) -> None:
    """Ray's own upload step for one value, measuring instead of uploading."""

    def measure(path: str, excludes: list[str] | None = None, is_file: bool = False) -> None:
        _check_package(Path(path), excludes or [], is_file=is_file, package=package, gitignore=include_gitignore)

    try:
        step(env, include_gitignore=include_gitignore, logger=log, upload_fn=measure)
    except _Problem as problem:
        raise UserInputFailure(field, value, str(problem)) from None
    except (TypeError, ValueError) as err:  # Ray's own rules: types, URI schemes, archive extensions
        raise UserInputFailure(field, value, str(err)) from None


def _check_package(path: Path, excludes: list[str], *, is_file: bool, package: bool, gitignore: bool) -> None:
    """What Ray is about to upload: a folder (zipped; a py_modules folder is imported by its name) or
    an archive / wheel file as it is."""
    if is_file:
        size = path.stat().st_size
    elif path.is_file():  # the SDK packs a single-file module as a folder, and fails
        raise _Problem(
            f"Ray's job submission ships a package folder, not a single file; move {path.name} into a folder "
            f"with an __init__.py (e.g. {path.stem}/__init__.py) and list that folder, or pass the file's folder "
            "as working_dir"
        )
    else:
        if package:
            _check_importable(path)
        size = _zip_bytes_if_over(path, excludes, include_parent_dir=package, gitignore=gitignore) or 0
    limit = max_package_bytes()
    if size > limit:
        raise _Problem(
            f"Ray uploads at most {_mib(limit)} per package through the dashboard and this one is {_mib(size)}; "
            "leave large files out (runtime_env['excludes'], a .rayignore or .gitignore), or upload the code "
            "yourself and give a remote URI such as gs://bucket/code.zip"
        )


def _check_importable(path: Path) -> None:
    """A py_modules folder becomes ``import <folder name>`` on the cluster: a package by that name."""
    name = path.absolute().name  # what Ray names the folder in the zip
    if not name.isidentifier() or keyword.iskeyword(name):
        suggestion = re.sub(r"\W", "_", name).lstrip("0123456789") or "my_package"
        raise _Problem(
            f"Python imports a py_modules folder by its name and {name!r} is not a module name; rename the "
            f"folder (e.g. {suggestion}) or pass it as working_dir"
        )
    if (path / "__init__.py").is_file():
        return
    inner = sorted(p.parent.name for p in path.glob("*/__init__.py"))
    hint = f" (e.g. {path / inner[0]})" if inner else ""
    raise _Problem(
        f"{name} has no __init__.py, so Ray would ship it as a package named {name!r}; list the package "
        f"folder itself{hint}, or pass the folder as working_dir to import the modules in it"
    )


def _zip_bytes_if_over(path: Path, excludes: list[str], *, include_parent_dir: bool, gitignore: bool) -> int | None:
    """The size of the zip Ray makes of ``path`` when it may exceed the limit, else None.

    Ray stores files uncompressed, so the files' bytes bound the zip from below and those bytes plus
    each entry's headers from above; only between the two is the zip made (with Ray's own
    create_package) and measured."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes, create_package

    limit = max_package_bytes()
    files, headers = 0, 0

    def count(entry: Path) -> None:
        nonlocal files, headers
        if entry.is_file() or (entry.is_dir() and next(entry.iterdir(), None) is None):
            files += entry.stat().st_size if entry.is_file() else 0
            headers += _ZIP_ENTRY_BYTES + 2 * len(str(entry.relative_to(path.parent)))

    _dir_travel(path, [_get_excludes(path, excludes)], count, include_gitignore=gitignore, logger=_log)
    if files > limit:
        return files
    if files + headers <= limit:
        return None
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "package.zip"
        create_package(
            str(path), target, include_gitignore=gitignore, include_parent_dir=include_parent_dir, excludes=excludes
        )
        return target.stat().st_size


def _local_path(value: Any) -> Path | None:
    """The local path a working_dir / py_modules value names, or None for a URI (Ray's reading)."""
    if isinstance(value, ModuleType) or not isinstance(value, str | Path):
        return None
    from ray._common.runtime_env_uri import parse_uri

    try:
        parse_uri(str(value))
    except ValueError:  # Ray reads anything that is not a URI of a known protocol as a local path
        return Path(value)
    return None


def _is_workloads(value: Any) -> bool:
    return isinstance(value, str | Path) and _local_path(value) is not None and _same_path(value, workloads_dir())


def _same_path(a: Any, b: Any) -> bool:
    if not isinstance(a, str | Path) or not isinstance(b, str | Path):
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def _shadow_fix(name: str) -> str:
    return (
        f"it holds its own {name}, which would shadow the {DRIVER_PACKAGE} that tpuflow ships beside your code "
        "with every job; remove or rename that copy"
    )


def _include_gitignore() -> bool:
    """As Ray's job SDK decides it: .gitignore files are honoured unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1."""
    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE

    return os.environ.get(RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"


def _mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"
