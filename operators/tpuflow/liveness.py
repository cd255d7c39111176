"""Who supervises a run, and whether that process is provably dead.

A supervisor record names one process on one boot of one host, in one pid namespace:
``{"host", "boot_id", "pid_ns", "pid", "start"}`` (``pid_ns``: the inode of /proc/self/ns/pid of the process
that wrote the record, the namespace its pid numbers belong to; ``start``: field 22 of /proc/<pid>/stat, the
process's start time in clock ticks since boot). A pid alone is not enough: after a reboot or a pid wrap the same
number names another process, and in another pid namespace (a container sharing this hostname) it names another
process or none. Leases and local cluster states carry the record of the process that supervises their run; a
waiter or the reaper takes over what a provably dead supervisor left behind, and only then:

- another host, or another pid namespace: nothing is provable here (its pid numbers are not ours);
- another boot id: "rebooted" only for a boot this machine has had (tpuflow_home()/boot-ids remembers every
  boot a record was written in), never for another machine that happens to share the hostname;
- the same namespace and boot: the pid is gone ("exited") or now names a process that started at another time
  ("reused"). A record without a namespace or a start time proves nothing more than it can.

Which process supervises: the one ``$TPUFLOW_SUPERVISOR`` names (JSON). It is named once, by the process that
supervises: ``tpuflow demo`` sets it for its children, naming itself, and an ``airflow dags test`` process names
itself when it first imports tpuflow (parsing the DAG), so the task processes its executor forks (``dags test
--use-executor``) inherit its name instead of guessing their own. Without it, the ``airflow dags test`` process
this one runs under (itself, or the ancestor whose executor forked it: read from /proc, never from this process's
own argv, which a forked child shares); else none: in a scheduler/worker deployment a task process ends with its
task while the run lives on, so there the run's state in the metadata DB decides, not a process.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

SUPERVISOR_ENV = "TPUFLOW_SUPERVISOR"
BOOTS_FILE = "boot-ids"


def boot_id() -> str:
    """This boot's id (Linux); empty where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> int | None:
    """The pid namespace this process's pid numbers (and /proc's) belong to: the inode of /proc/self/ns/pid.
    None where it cannot be read, or where /proc shows another namespace than this process's."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None  # /proc was mounted from another pid namespace: its numbers are not os.getpid()'s
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _boots_file() -> Path:
    from tpuflow.paths import tpuflow_home

    return tpuflow_home() / BOOTS_FILE


def known_boots() -> set[str]:
    """The boot ids this machine has had (as far as records were written here)."""
    try:
        return {line.strip() for line in _boots_file().read_text().splitlines() if line.strip()}
    except OSError:
        return set()


def remember_boot() -> None:
    """Add this boot to the machine's boot ids (what later proves a record's host rebooted)."""
    current = boot_id()
    if not current or current in known_boots():
        return
    if not _boots_file().parent.is_dir():
        return  # no tpuflow home yet (its first lease or cluster makes it): a bare command creates nothing
    try:
        with _boots_file().open("a") as f:  # one short line per append: concurrent writers do not interleave
            f.write(current + "\n")
    except OSError:
        pass  # unwritable home: a reboot is then not provable here, so nothing is taken over for it


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
    """The supervisor record of ``pid`` (default: this process), a pid as this process's namespace numbers it."""
    pid = os.getpid() if pid is None else pid
    remember_boot()
    return {
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "pid_ns": pid_namespace(),
        "pid": pid,
        "start": start_time(pid),
    }


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_dags_test(argv: list[str]) -> bool:
    """Whether ``argv`` runs `airflow dags test` (the console script, under an interpreter, or `-m airflow`)."""
    for i, arg in enumerate(argv[:3]):
        path = Path(arg)
        if path.name.startswith("airflow") or (path.name == "__main__.py" and path.parent.name == "airflow"):
            return [a for a in argv[i + 1 :] if not a.startswith("-")][:2] == ["dags", "test"]
    return False


def _parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def whole_run_process() -> int | None:
    """The `airflow dags test` process this process runs under: itself, or the ancestor whose executor forked it
    (its worker and task processes carry its command line until they retitle themselves, so the nearest such
    process is followed up while its parent has the very same command line). None when there is none."""
    pid: int | None = os.getpid()
    chain: list[tuple[int, list[str]]] = []
    while pid and pid > 1 and len(chain) < 64:
        chain.append((pid, _cmdline(pid)))
        pid = _parent(pid)
    for i, (found, argv) in enumerate(chain):
        if _is_dags_test(argv):
            for above, above_argv in chain[i + 1 :]:
                if above_argv != argv:
                    break
                found = above
            return found
    return None


def _named() -> dict[str, Any] | None:
    raw = os.environ.get(SUPERVISOR_ENV)
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "pid" in record else None


def supervisor_record() -> dict[str, Any] | None:
    """The record of the process that supervises the current run, or None when no process does."""
    named = _named()
    if named is not None:
        return named
    whole_run = whole_run_process()
    return None if whole_run is None else process_record(whole_run)


def name_this_process_if_it_runs_whole_dag_runs() -> None:
    """Name this process the supervisor of its children's runs ($TPUFLOW_SUPERVISOR) when it is an `airflow dags
    test` process itself (not one of the processes it forks) and nothing named one before: what it forks inherits
    the name, captured here once, instead of each guessing."""
    if _named() is None and whole_run_process() == os.getpid():
        os.environ[SUPERVISOR_ENV] = json.dumps(process_record())


def supervisor_env(record: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment that makes children name ``record`` (default: this process) as their supervisor."""
    return {SUPERVISOR_ENV: json.dumps(record or process_record())}


def dead_reason(record: object) -> str | None:
    """Why the supervisor ``record`` names is provably dead ("host H rebooted", "pid N exited", "pid N was
    reused"); None while it lives, or when that cannot be proved here (no record, another host, another pid
    namespace, a boot of another machine that shares the hostname)."""
    if not isinstance(record, dict):
        return None
    host, pid = record.get("host"), record.get("pid")
    if host != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool):
        return None
    recorded_boot, current_boot = record.get("boot_id"), boot_id()
    if recorded_boot and current_boot and recorded_boot != current_boot:
        return f"host {host} rebooted" if recorded_boot in known_boots() else None
    namespace = pid_namespace()
    if namespace is None or record.get("pid_ns") != namespace:
        return None  # its pid numbers are another namespace's (or unknown): pid N here is not its pid N
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
    keys = ("host", "boot_id", "pid_ns", "pid", "start")
    return isinstance(a, dict) and isinstance(b, dict) and all(a.get(k) == b.get(k) for k in keys)


name_this_process_if_it_runs_whole_dag_runs()
