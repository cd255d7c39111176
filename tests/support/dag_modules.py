"""DAG modules a test writes into a DAGs folder and imports (dag.test() needs the file there), removed after."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType


def import_dag_module(folder: Path, name: str, source: str) -> ModuleType:
    """folder/name.py holding ``source``, imported as the module ``name`` (folder on sys.path for the import only)."""
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        __import__(name)
    finally:
        sys.path.remove(str(folder))
    return sys.modules[name]


def remove_dag_module(folder: Path, name: str) -> None:
    """Forget the module ``name`` and delete its file folder/name.py."""
    sys.modules.pop(name, None)
    (folder / f"{name}.py").unlink(missing_ok=True)
