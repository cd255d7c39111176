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


def warn_renamed(old: str, new: type[Any]) -> None:
    """Warn that the operator class ``old`` is now ``new`` (the old name goes in the next release)."""
    warnings.warn(
        f"{old} is renamed {new.__name__} (from {new.__module__} import {new.__name__}); "
        f"{old} goes in the next release",
        AirflowProviderDeprecationWarning,
        stacklevel=3,
    )


def warn_replaced(old: str, replacement: str) -> None:
    """Warn that the class ``old`` is replaced by ``replacement`` (an operator and the argument that does
    what the subclass did); ``old`` goes in the next release."""
    warnings.warn(
        f"{old} is deprecated: use {replacement}; {old} goes in the next release",
        AirflowProviderDeprecationWarning,
        stacklevel=3,
    )


def warn_renamed_keyword(owner: str, old: str, new: str) -> None:
    """Warn that ``owner`` now takes ``new`` instead of ``old`` (a keyword renamed to carry its unit)."""
    warnings.warn(
        f"{owner}({old}=...) is renamed {new}; {old} goes in the next release",
        AirflowProviderDeprecationWarning,
        stacklevel=3,
    )
