"""tpuflow.pipeline.step_paths: a step's import path resolved without importing it (the module's file found as
``import`` finds it, "module:function" read from the file's AST), with what is wrong and the closest fix."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tpuflow.pipeline.step_paths import NotFound, Unresolved, check_import_path, top_level_names

FIT = """\
import os
import numpy as np
from math import pi as PI
from .helpers import scale, shift as moved

RATE = 0.1
a, (b, *c) = 1, (2, 3, 4)
limit: int = 3

if os.environ.get("ACME_FAST"):
    def train_loop(config):
        pass
else:
    def train_loop(config):
        pass

try:
    from acme_extra import booster
except ImportError:
    booster = None

with open(__file__) as handle:
    pass

class Trainer:
    def inner_method(self):
        pass

async def serve(args):
    def nested():
        pass
"""


@pytest.fixture
def acme(tmp_path: Path) -> Path:
    """tmp/acme: a package with a module, a subpackage, a runnable subpackage and a file that does not parse."""
    package = tmp_path / "acme"
    (package / "data").mkdir(parents=True)
    (package / "jobs").mkdir()
    for init in (package, package / "data", package / "jobs"):
        (init / "__init__.py").write_text("")
    (package / "fit.py").write_text(FIT)
    (package / "jobs" / "__main__.py").write_text("print('prep')\n")
    (package / "broken.py").write_text("def check(params):\n    if params\n")
    (package / "lazy.py").write_text("def __getattr__(name):\n    return name\n")
    (package / "star.py").write_text("from os.path import *\n")
    return tmp_path


def test_top_level_names_are_what_the_module_binds_when_imported() -> None:
    names = top_level_names(ast.parse(FIT))
    assert names is not None
    assert {"os", "np", "PI", "scale", "moved", "RATE", "a", "b", "c", "limit", "train_loop"} <= names
    assert {"booster", "handle", "Trainer", "serve"} <= names
    assert not {"inner_method", "nested", "config", "pi", "shift", "numpy"} & names


@pytest.mark.parametrize("source", ["from os.path import *\n", "def __getattr__(name):\n    return name\n"])
def test_a_module_whose_names_cannot_be_read_says_so(source: str) -> None:
    assert top_level_names(ast.parse(source)) is None


@pytest.mark.parametrize(
    ("path", "runnable"),
    [
        ("acme.fit:train_loop", False),
        ("acme.fit:booster", False),
        ("acme.fit:Trainer", False),
        ("acme.fit", True),
        ("acme.data", False),
        ("acme.jobs", True),  # a package with __main__.py runs with python -m
        ("acme.lazy:anything", False),  # a module __getattr__: nothing can be said against it
        ("acme.star:join", False),  # a star import: neither
    ],
)
def test_existing_paths_resolve(acme: Path, path: str, runnable: bool) -> None:
    check_import_path(path, [str(acme)], runnable=runnable)


def test_nothing_of_the_package_is_imported(acme: Path) -> None:
    check_import_path("acme.fit:train_loop", [str(acme)])
    assert "acme" not in sys.modules and "acme.fit" not in sys.modules


@pytest.mark.parametrize(
    ("path", "what", "fixed"),
    [
        ("acme.fitt:train_loop", "no module acme.fitt in", "acme.fit:train_loop"),
        ("acme.fit:trian_loop", "acme/fit.py defines no top-level trian_loop (it defines Trainer, serve, train_loop)", "acme.fit:train_loop"),
        ("acme.data.loader", "no module acme.data.loader in", None),
        ("acme.fit.sub:train_loop", "acme.fit is a module, not a package: it holds no sub", None),
        ("acme.broken:check", "acme/broken.py does not parse (line 2", None),
    ],
)  # fmt: skip
def test_a_missing_module_or_function_names_what_is_there_and_the_closest_fix(
    acme: Path, path: str, what: str, fixed: str | None
) -> None:
    with pytest.raises(Unresolved) as caught:
        check_import_path(path, [str(acme)])
    assert what in caught.value.what and caught.value.fixed == fixed
    assert "\n" not in str(caught.value)


def test_a_missing_module_lists_its_packages_modules(acme: Path) -> None:
    with pytest.raises(Unresolved) as caught:
        check_import_path("acme.fitt:train_loop", [str(acme)])
    assert str(acme / "acme") in caught.value.what
    assert "(acme has broken, data, fit, jobs, lazy, star)" in caught.value.what


def test_a_package_run_with_python_m_needs_its_main(acme: Path) -> None:
    check_import_path("acme.data", [str(acme)])  # imported: fine
    with pytest.raises(Unresolved, match="acme.data is a package without __main__.py"):
        check_import_path("acme.data", [str(acme)], runnable=True)


def test_a_package_that_is_not_there_is_not_judged(acme: Path) -> None:
    with pytest.raises(NotFound):
        check_import_path("elsewhere.fit:loop", [str(acme)])
    with pytest.raises(NotFound):
        check_import_path("no_such_package_anywhere.fit:loop", None)


def test_import_mode_finds_installed_and_editable_packages_without_importing_them() -> None:
    """None: where ``import`` looks, the interpreter's finders too (tpuflow is an editable install here, and its
    tpuflow.workloads is another folder of the checkout)."""
    check_import_path("tpuflow.workloads.addition.pipeline:check_params", None)
    check_import_path("json.decoder:JSONDecoder", None)
    with pytest.raises(Unresolved) as caught:
        check_import_path("tpuflow.workloads.addition.pipeline:check_paramz", None)
    assert caught.value.fixed == "tpuflow.workloads.addition.pipeline:check_params"
