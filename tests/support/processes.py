"""What the tests read of other processes through /proc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any


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


def sleeper(started: list[subprocess.Popen], *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A 60 s `sleep` (plus `args` on its command line) in its own session, as a Ray node or a service runs;
    appended to `started` so the test stops exactly it."""
    code = "import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True, env=env)
    started.append(proc)
    return proc


def survives(proc: subprocess.Popen, wait: float = 0.5) -> bool:
    """Whether `proc` is still running `wait` seconds from now."""
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        return True
    return False


def dead_process_record() -> dict[str, Any]:
    """The liveness record (tpuflow.liveness) of a process that has exited and been waited for."""
    from tpuflow import liveness

    proc = subprocess.Popen(["sleep", "30"])
    record = liveness.process_record(proc.pid)
    proc.kill()
    proc.wait()
    return record
