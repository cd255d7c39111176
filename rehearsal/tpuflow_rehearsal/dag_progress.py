"""What `tpuflow demo` and `tpuflow run` show while `airflow dags test` runs: a line per task as it ends (its state
and how long it took), the training's step and loss now and then, and, when a task failed, that task's last log
lines. Airflow's own log (about 800 lines for the demo) goes whole to a file whose path is printed.

Read from the log's own markers: `airflow dags test` says ``[DAG TEST] starting task_id=...`` and ``[DAG TEST] end
task task_id=...`` around each task it runs, and the execution API logs each ``new_state=`` in between.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

START = re.compile(r"\[DAG TEST\] starting task_id=(?P<task>\S+) map_index=(?P<index>-?\d+)")
END = re.compile(r"\[DAG TEST\] end task task_id=(?P<task>\S+) map_index=(?P<index>-?\d+)")
STATE = re.compile(r"Task instance state updated\b.*\bnew_state=(?P<state>[a-z_]+)")
# the addition workloads' driver line (workloads/addition/training.py); a team's own loop prints what it likes
STEP = re.compile(r"\bstep (?P<step>\d+)/(?P<total>\d+) epoch \d+ loss (?P<loss>[0-9.]+(?:e[+-]?\d+)?)")
TAIL_LINES = 40  # of a failed task's log, shown
KEPT_LINES = 1000  # of each task's log, kept while it runs


class DagTestProgress:
    """Turns the run's log lines into the few lines a person watching it needs (``feed`` returns them)."""

    def __init__(self, started: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock() if started is None else started
        self.task: str | None = None
        self.task_started = self.started
        self.state = ""
        self.quarter = -1  # the last quarter of the training steps reported
        self.failed: list[tuple[str, list[str]]] = []  # (task, its last log lines), in the order they failed
        self._lines: deque[str] = deque(maxlen=KEPT_LINES)

    def _at(self) -> str:
        return f"[{self.clock() - self.started:5.0f}s]"

    def feed(self, line: str) -> list[str]:
        line = line.rstrip("\n")
        if (start := START.search(line)) is not None:
            name = start["task"] if start["index"] == "-1" else f"{start['task']}[{start['index']}]"
            self.task, self.task_started, self.state = name, self.clock(), ""
            self._lines.clear()
            return []
        if self.task is None:
            return []
        self._lines.append(line)
        if (state := STATE.search(line)) is not None:
            self.state = state["state"]
            return []
        if END.search(line) is not None:
            took = self.clock() - self.task_started
            said = f"{self._at()} {self.task:<32} {self.state or 'ended'} in {took:.0f}s"
            if self.state in ("failed", "up_for_retry"):
                self.failed.append((self.task, list(self._lines)[:-1]))
            self.task = None
            return [said]
        if (step := STEP.search(line)) is not None:
            quarter = 4 * int(step["step"]) // max(int(step["total"]), 1)
            if quarter > self.quarter:
                self.quarter = quarter
                return [f"{self._at()}   {self.task}: step {step['step']}/{step['total']}, loss {step['loss']}"]
        return []

    def failure_lines(self) -> list[str]:
        """The last log lines of the task that failed last (its final try), to print when the run failed."""
        if not self.failed:
            return []
        task, lines = self.failed[-1]
        shown = _without_library_frames(lines)[-TAIL_LINES:]
        return [f"--- the last {len(shown)} log lines of {task} (library frames left out) ---", *shown, "---"]


def _without_library_frames(lines: list[str]) -> list[str]:
    """A traceback's frames in installed packages (Airflow's task runner, Ray's client) left out: what is left is the
    task's own output, the frames of the team's code and the exception."""
    out, skipping = [], False
    for line in lines:
        if line.startswith('  File "'):
            skipping = "site-packages" in line
        elif not (skipping and line.startswith("    ")):
            skipping = False
        if not skipping:
            out.append(line)
    return out


def say(line: str) -> None:
    """A progress line, printed at once (the run goes on for minutes)."""
    print(line, flush=True)


def airflow_log(home: Path, run_date: str) -> Path:
    """Where a run's `airflow dags test` output goes (the Airflow home's logs folder, one file per date)."""
    return home / "logs" / f"dags-test-{run_date}.log"


@contextlib.contextmanager
def following(log: Path, say: Callable[[str], None]) -> Iterator[DagTestProgress]:
    """Say what the run's ``log`` shows while the block runs (a reader thread), and the rest of it once it ends."""
    progress, done = DagTestProgress(), threading.Event()
    reader = threading.Thread(target=follow, args=(log, done, say, progress), name="dag-progress", daemon=True)
    reader.start()
    try:
        yield progress
    finally:
        done.set()
        reader.join(30)


def follow(log: Path, done: threading.Event, say: Callable[[str], None], progress: DagTestProgress) -> None:
    """Read ``log`` as it grows until ``done`` is set and nothing is left, saying what ``progress`` makes of it."""
    with log.open(errors="replace") as stream:
        _drain(stream, done, say, progress)


def _drain(stream: IO[str], done: threading.Event, say: Callable[[str], None], progress: DagTestProgress) -> None:
    pending = ""
    while True:
        chunk = stream.read()
        if chunk:
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                for out in progress.feed(line):
                    say(out)
            continue
        if done.is_set():
            for out in progress.feed(pending) if pending else []:
                say(out)
            return
        done.wait(0.5)
