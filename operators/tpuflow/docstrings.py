"""A base operator's ``:param`` entries reach its subclasses' docstrings, so an argument a whole family of
operators takes (the connection, the namespace, the waits) is described once, in the class that takes it.
Sphinx and ``help()`` read ``__doc__``, so both show the full list; pandas' ``@doc`` and the custom_inherit
package do the same, but each for a different docstring shape, hence these few lines.

An entry the subclass writes itself wins (a different default, a narrower meaning). Only the family's bases
are read (those that are ``InheritedParamDocs``): Airflow's BaseOperator documents its arguments on its own
page.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

_ENTRY = re.compile(r"^:param (\w+):")


def param_entries(doc: str | None) -> dict[str, str]:
    """``{name: entry}`` of a docstring's ``:param name:`` entries, continuation lines included."""
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in inspect.cleandoc(doc or "").splitlines():
        match = _ENTRY.match(line)
        if match:
            current = entries.setdefault(match.group(1), [line])
        elif current is not None and line.startswith((" ", "\t")):
            current.append(line)
        else:
            current = None
    return {name: "\n".join(lines) for name, lines in entries.items()}


def inherited_param_docs(cls: type) -> str | None:
    """``cls``'s own docstring with the entries of its family's bases that it does not write itself."""
    own_doc: str | None = cls.__dict__.get("__doc__")
    if not own_doc:
        return own_doc
    written = set(param_entries(own_doc))
    added: list[str] = []
    for base in cls.__mro__[1:]:
        if not issubclass(base, InheritedParamDocs):
            continue
        for name, entry in param_entries(base.__dict__.get("__doc__")).items():
            if name not in written:
                written.add(name)
                added.append(entry)
    if not added:
        return own_doc
    lines = inspect.cleandoc(own_doc).splitlines()
    at = _after_last_entry(lines)
    return "\n".join([*lines[:at], *added, *lines[at:]])


def _after_last_entry(lines: list[str]) -> int:
    """The line after the docstring's last ``:param`` entry (its end when it has none), where prose that
    follows the entries (``Returns ...``) stays below the added ones."""
    last = None
    for index, line in enumerate(lines):
        if _ENTRY.match(line):
            last = index
    if last is None:
        return len(lines)
    end = last + 1
    while end < len(lines) and lines[end].startswith((" ", "\t")):
        end += 1
    return end


class InheritedParamDocs:
    """The mixin: each subclass's docstring gains the ``:param`` entries of its bases it does not write."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__doc__ = inherited_param_docs(cls)
