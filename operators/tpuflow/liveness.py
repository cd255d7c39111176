"""Who supervises a run, and whether that process is provably dead.

A supervisor record names one process on one boot of one host: ``{"host", "boot_id", "pid", "start"}``
(``start``: field 22 of /proc/<pid>/stat, the process's start time in clock ticks since boot). A pid alone
is not enough: after a reboot or a pid wrap the same number names another process. Leases and local
cluster states carry the record of the process that supervises their run; a waiter or the reaper takes
over what a provably dead supervisor left behind.

Which process supervises: the one ``$TPUFLOW_SUPERVISOR`` names (JSON; ``tpuflow demo`` sets it for its
children, naming itself), else the current process when it runs the whole DAG run itself (``airflow dags
test``), else none: in a scheduler/worker deployment a task process ends with its task while the run lives
on, so there the run's state in the metadata DB decides, not a process.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

SUPERVISOR_ENV = "TPUFLOW_SUPERVISOR"


def boot_id() -> str:
    """This boot's id (Linux); empty where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from field 3 (state) on; None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")".
    return text[text.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot), or None when it is gone or a zombie."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of stat; fields[0] is field 3


def process_record(pid: int | None = None) -> dict[str, Any]:
    """The supervisor record of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "boot_id": boot_id(), "pid": pid, "start": start_time(pid)}


def _runs_a_whole_dag_run() -> bool:
    """Whether this process is `airflow dags test` (it runs every task and trigger of the run itself)."""
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    return Path(sys.argv[0]).name.startswith("airflow") and args[:2] == ["dags", "test"]


def supervisor_record() -> dict[str, Any] | None:
    """The record of the process that supervises the current run, or None when no process does."""
    raw = os.environ.get(SUPERVISOR_ENV)
    if raw:
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if isinstance(record, dict) and "pid" in record:
            return record
    return process_record() if _runs_a_whole_dag_run() else None


def supervisor_env(record: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment that makes children name ``record`` (default: this process) as their supervisor."""
    return {SUPERVISOR_ENV: json.dumps(record or process_record())}


def dead_reason(record: object) -> str | None:
    """Why the supervisor ``record`` names is provably dead ("host H rebooted", "pid N exited", "pid N was
    reused"); None while it lives, or when that cannot be proved here (no record, another host)."""
    if not isinstance(record, dict):
        return None
    host, pid = record.get("host"), record.get("pid")
    if host != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool):
        return None
    if record.get("boot_id") and boot_id() and record["boot_id"] != boot_id():
        return f"host {host} rebooted"
    started = start_time(pid)
    if started is None:
        return f"pid {pid} exited"
    if record.get("start") is not None and started != record["start"]:
        return f"pid {pid} was reused"
    return None


def describe(record: object) -> str:
    """``pid N on host H`` (or ``no supervising process``)."""
    if not isinstance(record, dict) or "pid" not in record:
        return "no supervising process"
    return f"pid {record['pid']} on host {record.get('host', '?')}"


def same_process(a: object, b: object) -> bool:
    """Whether two records name the same process."""
    keys = ("host", "boot_id", "pid", "start")
    return isinstance(a, dict) and isinstance(b, dict) and all(a.get(k) == b.get(k) for k in keys)
