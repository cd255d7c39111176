"""Supervise what a CLI command starts (`tpuflow demo`, `tpuflow airflow up`): a killed command leaves nothing
running and nothing held.

- Children run in their own process group (a terminal's Ctrl-C reaches only this process) and get
  PR_SET_PDEATHSIG(SIGKILL) (Linux): a SIGKILLed supervisor does not orphan them. SIGKILL, not SIGTERM:
  `airflow dags test` answers SIGTERM by calling the running task's on_kill() and then runs the rest of
  the DAG (retries included) with nobody watching; what a killed child leaves names this (dead) process as
  its supervisor, so the next run takes its lease over and `tpuflow reap` removes the rest.
- The first SIGINT/SIGTERM is forwarded to every child's group; once they exit (or after ``grace`` seconds,
  then SIGKILL) the teardowns run (stop the local Ray clusters and release the slice leases the run left,
  each found by this process's supervisor record) and the command exits 130 (SIGINT) or 143 (SIGTERM),
  printing one line that names what it cleaned. A second signal kills the children's groups at once.
- Children name this process as their run's supervisor ($TPUFLOW_SUPERVISOR, tpuflow.liveness): what a
  SIGKILLed supervisor left, a waiting run takes over and `tpuflow reap` removes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from tpuflow import liveness

if TYPE_CHECKING:
    from tpuflow.slices.leases import Lease

EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}
_PR_SET_PDEATHSIG = 1


class Interrupted(Exception):
    """A forwarded SIGINT/SIGTERM: unwinds the command to its Supervisor, which cleans up and exits."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _libc() -> Any:
    """libc, loaded in the parent: a preexec_fn must not dlopen (locks another thread may hold)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A preexec_fn: the child gets ``sig`` when ``parent`` dies (Linux prctl; a no-op elsewhere)."""
    libc = _LIBC

    def preexec() -> None:
        if libc is None:
            return
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


# Linux sends PR_SET_PDEATHSIG when the *thread* that forked the child ends: a child started from a short-lived
# thread (a fault injector restarting kube-apiserver) died as soon as that thread returned. One worker thread, alive
# as long as the process, forks every such child.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpuflow-spawner")


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **kwargs)`` for a child that dies with this process (PR_SET_PDEATHSIG SIGKILL),
    forked from one long-lived thread whichever thread asks."""
    parent = os.getpid()
    return _SPAWNER.submit(lambda: subprocess.Popen(argv, preexec_fn=die_with_parent(parent), **kwargs)).result()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Supervisor:
    """``with Supervisor("tpuflow demo") as sup: sup.run([...])``: see the module docstring."""

    def __init__(self, name: str, *, grace: float = 60.0, say: Callable[[str], None] = _say) -> None:
        self.name, self.grace, self.say = name, grace, say
        self.record = liveness.process_record()
        self.children: list[subprocess.Popen[Any]] = []
        self.teardowns: list[Callable[[], list[str]]] = []
        self.cleaned: list[str] = []
        self.signum: int | None = None
        self._tearing_down = False
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    # --- children ----------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment entries that make children name this process as their run's supervisor."""
        return liveness.supervisor_env(self.record)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        self.check()
        proc = subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent(os.getpid()), **kwargs)
        self.children.append(proc)
        return proc

    def run(self, argv: list[str], *, check: bool = False, **kwargs: Any) -> int:
        """Run ``argv`` to its end (Interrupted if a signal came meanwhile); its exit code."""
        proc = self.popen(argv, **kwargs)
        code = proc.wait()
        self.check()
        if check and code != 0:
            raise subprocess.CalledProcessError(code, argv)
        return code

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    def _live_children(self) -> list[subprocess.Popen[Any]]:
        return [c for c in self.children if c.poll() is None]

    def _signal_children(self, sig: int) -> None:
        for child in self._live_children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, sig)

    # --- teardowns ---------------------------------------------------------
    def add_teardown(self, teardown: Callable[[], list[str]]) -> None:
        """Run on an interruption (last added first); returns what it cleaned, one phrase each."""
        self.teardowns.append(teardown)

    def note(self, cleaned: str) -> None:
        """Something an unwinding block cleaned (e.g. the emulator a `with` stopped)."""
        self.cleaned.append(cleaned)

    # --- signals -----------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # a second signal: no more waiting
            self._signal_children(signal.SIGKILL)
            if self._tearing_down:
                self.say(f"{self.name}: {signal.Signals(signum).name} again: exiting now, teardown cut short")
                os._exit(EXIT_CODES.get(self.signum, 128 + self.signum))
            raise Interrupted(self.signum)
        self.signum = signum
        if not self._live_children():
            raise Interrupted(signum)
        self._signal_children(signum)
        self._timer = threading.Timer(self.grace, self._signal_children, args=(signal.SIGKILL,))
        self._timer.daemon = True
        self._timer.start()

    def __enter__(self) -> Supervisor:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        signum = exc.signum if isinstance(exc, Interrupted) else self.signum
        if signum is None:
            self._restore()
            return
        self._tearing_down = True
        self._wait_children()
        for teardown in reversed(self.teardowns):
            try:
                self.cleaned += teardown()
            except Exception as err:  # one failed teardown must not skip the others
                self.cleaned.append(f"FAILED {getattr(teardown, '__name__', 'teardown')}: {err}")
        self._restore()
        what = "; ".join(self.cleaned) or "nothing was left to clean"
        self.say(f"{self.name}: interrupted by {signal.Signals(signum).name}: {what}")
        raise SystemExit(EXIT_CODES.get(signum, 128 + signum))

    def _wait_children(self) -> None:
        for child in self.children:
            try:
                child.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        if self._timer is not None:
            self._timer.cancel()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


# --- what a run supervised by ``record`` left -------------------------------------------------------------
def stop_supervised_clusters(record: dict[str, Any], base_dir: Any = None) -> list[str]:
    """Stop the local Ray clusters whose run ``record`` supervised (not kept ones) and remove their state."""

    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster, default_base_dir

    cleaned = []
    for state in sorted(Path(base_dir or default_base_dir()).glob(f"*/{STATE_FILE}")):
        try:
            cluster = LocalRayCluster.load(state.parent)
        except (OSError, ValueError, TypeError):
            continue
        if cluster.kept or not liveness.same_process(getattr(cluster, "supervisor", None), record):
            continue
        cluster.stop()
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
        cleaned.append(f"stopped local Ray cluster {cluster.name}")
    return cleaned


def release_supervised_leases(record: dict[str, Any], lease_root: str | None = None) -> list[str]:
    """Release the slice leases whose holder ``record`` supervised."""
    from tpuflow.slices.leases import lease_store

    store = lease_store(lease_root)
    holders = {
        lease.holder for lease in store.all_holders().values() if liveness.same_process(lease.supervisor, record)
    }
    cleaned = []
    for holder in sorted(holders):
        freed = store.release(holder)
        if freed:
            cleaned.append(f"released slice lease(s) {freed} of {holder}")
    return cleaned


def _holder_text(lease: Lease) -> str:
    dead = lease.dead_reason()
    return lease.holder_line() + (f" [{dead}: the run takes it over]" if dead else "")


class LeaseWaitReporter(threading.Thread):
    """While the supervised run has no slice lease and others hold too many to leave it ``count``, say who holds
    them (once per change): "waiting for slice lease held by DAG/RUN (pid N on host H)"."""

    def __init__(
        self,
        record: dict[str, Any],
        *,
        slots: int,
        count: int = 1,
        lease_root: str | None = None,
        say: Callable[[str], None] = _say,
        interval: float = 2.0,
        prefix: str = "tpuflow demo",
    ) -> None:
        super().__init__(daemon=True, name="lease-wait-reporter")
        self.record, self.slots, self.count, self.lease_root = record, slots, count, lease_root
        self.say, self.interval, self.prefix = say, interval, prefix
        self.stopping = threading.Event()
        self._last: list[str] | None = None

    def poll(self) -> str | None:
        """Look once; the line said, if any."""
        from tpuflow.slices.leases import lease_store

        try:
            held = list(lease_store(self.lease_root).all_holders().values())
        except Exception:  # a folder being written, a storage hiccup: look again next time
            return None
        if any(liveness.same_process(lease.supervisor, self.record) for lease in held):
            waiting: list[str] | None = None
        elif self.slots - len(held) < self.count:
            waiting = sorted(_holder_text(lease) for lease in held)
        else:
            waiting = None
        line = None
        if waiting and waiting != self._last:
            line = f"{self.prefix}: waiting for slice lease held by {', '.join(waiting)}"
            self.say(line)
        self._last = waiting
        return line

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self.stopping.set()


@contextlib.contextmanager
def reporting_lease_waits(reporter: LeaseWaitReporter) -> Iterator[LeaseWaitReporter]:
    reporter.start()
    try:
        yield reporter
    finally:
        reporter.stop()
