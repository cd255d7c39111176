"""What the tests read of other processes through /proc."""

from __future__ import annotations

import os
from pathlib import Path


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces; "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_with_env(key: str, value: str) -> list[str]:
    """'pid: command line' of each process (not this one) whose environment has key=value."""
    needle = f"{key}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(f"{proc.name}: {cmdline(int(proc.name))[:200]}")
        except OSError:
            continue
    return found
