"""Whether an operator argument is still a template: the one test every parse-time check uses.

A value is static when it holds no Jinja (``{{``/``{%``) and no XComArg anywhere inside it; only
static values can be checked when the DAG file is parsed. Templated values are checked once
rendered, at the start of ``execute`` (before anything billable).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any


def is_static(value: Any) -> bool:
    """A plain value (not a Jinja template or an XComArg, nor a container holding one)."""
    if value is None or isinstance(value, (bool, int, float, timedelta)):
        return True
    if getattr(type(value), "static_value", False):  # a value object built from literals (TpuSlice)
        return True
    if isinstance(value, str):
        return "{{" not in value and "{%" not in value
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(is_static(v) for v in value)
    if isinstance(value, Mapping):
        return all(is_static(k) and is_static(v) for k, v in value.items())
    return False


def is_templated(*values: Any) -> bool:
    """True when any of the values is rendered only at run time."""
    return not all(is_static(v) for v in values)


def is_true(value: Any) -> bool:
    """A rendered flag: True, or a string such as "true" / "1" / "yes" (Jinja renders booleans as text)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)
