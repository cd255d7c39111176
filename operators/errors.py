"""Exceptions shared across the package, kept free of heavy imports."""

from __future__ import annotations


class UserInputError(ValueError):
    """Input a user must fix. The message names the field, the bad value and the fix."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"{field}={value!r} is invalid: {fix}")
