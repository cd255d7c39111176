"""The quality gate on a Ray job's result (``min_result``), for the operator and for the trigger
that ends the task in the triggerer: one rule, so both ends of a job judge its result alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def gate_failure(result: Mapping[str, Any], min_result: Mapping[str, Any] | None) -> str | None:
    """Why ``result`` fails the gate (a key missing or below its minimum; a key is looked up in the
    result, then in its ``metrics``; a dotted key ``a.b`` is ``b`` of the mapping ``a``, e.g.
    ``evaluation.accuracy``), or None when it passes."""
    raw_metrics = result.get("metrics")
    metrics: Mapping[str, Any] = raw_metrics if isinstance(raw_metrics, Mapping) else {}
    for key, minimum in (min_result or {}).items():
        value = _lookup(result, key)
        if value is None:
            value = _lookup(metrics, key)
        if not isinstance(value, int | float) or value < float(minimum):
            return f"quality gate: {key}={value!r} is below the required {minimum}; not continuing"
    return None


def _lookup(mapping: Mapping[str, Any], key: str) -> Any:
    if key in mapping:
        return mapping[key]
    head, dot, rest = key.partition(".")
    inner = mapping.get(head) if dot else None
    return _lookup(inner, rest) if isinstance(inner, Mapping) else None
