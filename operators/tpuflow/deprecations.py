"""Old names kept for one release: each use warns with Airflow's AirflowProviderDeprecationWarning, naming
what replaces it (an operator renamed to ``<Product><Verb><Noun>Operator``, a keyword renamed to carry its
unit).

A renamed operator keeps its old name as a subclass of the new class whose ``__init__`` calls
``warn_renamed`` first: DAGs that use the old name still parse and run, and the warning says what to write
instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning


def _warn(message: str) -> None:
    # stacklevel 4: past this function, the warn_* that called it and the deprecated __init__ (an operator's
    # init wrappers still stand between that and the DAG file)
    warnings.warn(message, AirflowProviderDeprecationWarning, stacklevel=4)


def warn_renamed(old: str, new: type[Any]) -> None:
    """Warn that the operator class ``old`` is now ``new`` (the old name goes in the next release)."""
    _warn(
        f"{old} is renamed {new.__name__} (from {new.__module__} import {new.__name__}); {old} goes in the next release"
    )


def warn_replaced(old: str, replacement: str) -> None:
    """Warn that the class ``old`` is replaced by ``replacement`` (an operator and the argument that does
    what the subclass did); ``old`` goes in the next release."""
    _warn(f"{old} is deprecated: use {replacement}; {old} goes in the next release")


def warn_renamed_keyword(owner: str, old: str, new: str) -> None:
    """Warn that ``owner`` now takes ``new`` instead of ``old`` (a keyword renamed to carry its unit)."""
    _warn(f"{owner}({old}=...) is renamed {new}; {old} goes in the next release")
