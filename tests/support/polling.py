"""Waiting for something a background thread or server does, without sleeping longer than it takes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(get: Callable[[], Any], check: Callable[[Any], bool] = bool, timeout: float = 10.0) -> Any:
    """``get()`` every 20 ms until ``check`` accepts its value or ``timeout`` seconds have passed; returns the
    last value either way, for the caller to assert on (so a failure shows what it was)."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if check(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.02)
