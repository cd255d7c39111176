"""Exceptions shared across the package, kept free of heavy imports."""

from __future__ import annotations

# A whole manifest or config as the bad value would bury the fix: its repr is cut to this length.
MAX_VALUE_CHARS = 200


def _one_line(text: str) -> str:
    return " ".join(text.split())


class UserInputError(ValueError):
    """Input a user must fix. The message names the field, the bad value and the fix, on one line."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field = field
        self.value = value
        self.fix = fix
        shown = repr(value)
        if len(shown) > MAX_VALUE_CHARS:
            shown = shown[: MAX_VALUE_CHARS - 3] + "..."
        super().__init__(f"{field}={shown} is invalid: {_one_line(fix)}")
