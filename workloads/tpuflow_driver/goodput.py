"""Where a training run's time goes: a clock in the train loop, a recorder beside the driver.

Each worker's loop keeps a `StepClock`: every span of its wall time since the previous mark is charged to
one cause: ``startup`` (loop entry to the first batch), ``restore`` (the same after a restart: the
checkpoint is loaded), ``data_wait`` (blocked on the next batch), ``compile`` (an attempt's first step),
``productive`` (a step that takes the model further than any attempt did), ``redone`` (a step an earlier
attempt had already computed), ``checkpoint`` (saving and reporting one), ``preemption`` (holding inside
a notice), ``evaluation`` (a loop that evaluates after its last step). Rank 0 sends its totals, at most
once every ``flush_s``, to the driver's `recorder`, a named actor on the driver's node with no CPU; a
restarted worker group asks it how far the earlier attempts got, which is how a step is known to be redone.
A sudden kill loses at most the last ``flush_s`` of records: those steps' time falls in the gap (the
preemption), and computing them again counts as productive. The driver then joins the attempts into the
run's timeline (`training_timeline`): the gap between one attempt's last record and the next one's start is
the ``preemption`` (a host was lost) or ``failure`` that caused the restart; ``recorded`` says which steps
each attempt's records reached.

Ray Train 2.60 keeps no per-step timing of its own (its metrics are what the loop reports, with a
checkpoint); the loop is the only place that knows what a step was waiting for, hence this module.
A loop of a team's own::

    from tpuflow_driver.goodput import StepClock

    def train_loop_per_worker(config):
        clock = StepClock.for_worker()              # first thing in the loop
        ...                                          # set up; restore the checkpoint (step = its step, or 0)
        clock.begin(step)
        for batch in batches:
            clock.mark("data_wait")
            train_step(batch)
            step += 1
            clock.step(step)                         # productive, redone or compile
            if step % every == 0:
                save_and_report()
                clock.mark("checkpoint")
        clock.flush()

Without the driver (a script submitted on its own) the clock records nothing and costs two clock reads a
step. Times are the hosts' wall clocks (``time.time``): the driver and the workers are on different VMs.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

RECORDER_NAME = "tpuflow-goodput"
LOOP_CAUSES = (
    "startup",
    "restore",
    "data_wait",
    "compile",
    "productive",
    "redone",
    "checkpoint",
    "preemption",
    "evaluation",
)
FLUSH_S = 0.5


class StepClock:
    """Charges the loop's wall time since the previous mark to a cause; rank 0 reports to the recorder.

    ``redo_until``: the furthest step any earlier attempt of this run computed (asked of the recorder);
    a step at or below it is ``redone``. ``timeline``: a list that gets every span as it is charged,
    ``(cause, start, end, step)`` (the step the loop had reached), e.g. to hand the run to another
    goodput calculator; None (the default) keeps totals only.
    """

    def __init__(
        self,
        *,
        send: Callable[[str, dict[str, Any]], None] | None = None,
        redo_until: int = 0,
        clock: Callable[[], float] = time.time,
        flush_s: float = FLUSH_S,
        timeline: list[tuple[str, float, float, int]] | None = None,
    ) -> None:
        self._send, self._clock, self._flush_s = send, clock, flush_s
        self.timeline = timeline
        self.key = uuid.uuid4().hex
        self.start_step = self.step_no = 0
        self.redo_until = int(redo_until)
        self.began_at = self._last = self._flushed = clock()
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps: dict[str, int] = defaultdict(int)
        self.step_cause = "productive"  # what the latest step was
        self.saves = 0  # checkpoints saved

    @classmethod
    def for_worker(cls, **kwargs: Any) -> StepClock:
        """The clock of this Ray Train worker: rank 0's reports to the driver's recorder, if there is one."""
        import ray
        import ray.train

        began = time.time()
        if ray.train.get_context().get_world_rank() != 0:
            return cls(**kwargs)
        try:
            recorder = ray.get_actor(RECORDER_NAME)
            reached = int(ray.get(recorder.begin.remote(), timeout=30))
        except Exception:  # no recorder: a loop run without tpuflow's driver records nothing
            return cls(**kwargs)

        def send(key: str, record: dict[str, Any]) -> None:
            recorder.update.remote(key, record)  # not awaited: a step never waits on the recorder

        clock = cls(send=send, redo_until=reached, **kwargs)
        clock.began_at = began
        return clock

    def begin(self, step: int) -> None:
        """The loop is about to take its first step after ``step`` (0, or the restored checkpoint's step): the
        time so far went to ``startup``, or to ``restore`` after a restart."""
        self.start_step = self.step_no = int(step)
        self.mark("restore" if step else "startup")

    def mark(self, cause: str) -> None:
        """The time since the previous mark went to ``cause``."""
        now = self._clock()
        if cause == "checkpoint":
            self.saves += 1
        self.seconds[cause] += now - self._last
        if self.timeline is not None:
            self.timeline.append((cause, self._last, now, self.step_no))
        self._last = now
        if self._send is not None and now - self._flushed >= self._flush_s:
            self.flush()

    def step(self, step: int) -> None:
        """Step ``step`` was computed: the time since the previous mark went to it."""
        if not self.steps:
            cause = "compile"
        elif step <= self.redo_until:
            cause = "redone"
        else:
            cause = "productive"
        self.steps[cause] += 1
        self.step_no, self.step_cause = step, cause
        self.mark(cause)

    def record(self) -> dict[str, Any]:
        return {
            "began_at": self.began_at,
            "last_at": self._last,
            "start_step": self.start_step,
            "step": self.step_no,
            "seconds": dict(self.seconds),
            "steps": dict(self.steps),
            "saves": self.saves,
        }

    def flush(self) -> None:
        """Send the totals now (before a hold that may end in a kill, and at the loop's end)."""
        self._flushed = self._clock()
        if self._send is not None:
            try:
                self._send(self.key, self.record())
            except Exception:  # the recorder is gone: training goes on unrecorded
                self._send = None


class Recorder:
    """The driver's side: every attempt's latest record, keyed by the attempt's clock."""

    def __init__(self) -> None:
        self.attempts: dict[str, dict[str, Any]] = {}

    def begin(self) -> int:
        """A new attempt starts: the furthest step the earlier ones computed."""
        return max((int(a["step"]) for a in self.attempts.values()), default=0)

    def update(self, key: str, record: dict[str, Any]) -> None:
        self.attempts[key] = record

    def records(self) -> list[dict[str, Any]]:
        return sorted(self.attempts.values(), key=lambda a: a["began_at"])


def start_recorder() -> Any:
    """The recorder actor, on the driver's node, holding no CPU (it must not take a slice's host)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    actor = ray.remote(Recorder).options(
        name=RECORDER_NAME,
        num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
    )
    return actor.remote()


def training_timeline(
    attempts: Iterable[Mapping[str, Any]],
    fit_started_at: float,
    fit_ended_at: float,
    *,
    hosts_lost: bool,
    checkpoint_every: int | None = None,
) -> dict[str, Any]:
    """The fit's wall seconds by cause, from the attempts' records (oldest first).

    Before the first attempt and after the last one's final record: ``startup`` (the worker group and its
    datasets coming up, Ray Train's shutdown). Between two attempts: ``preemption`` when a host was lost
    during the fit, else ``failure``. With ``checkpoint_every`` (steps), the checkpoint trade-off: what a save
    costs, and the work a sudden preemption puts at risk (up to one interval of productive steps).
    """
    ordered = sorted(attempts, key=lambda a: a["began_at"])
    seconds: dict[str, float] = defaultdict(float)
    steps: dict[str, int] = defaultdict(int)
    if not ordered:
        seconds["startup"] = max(0.0, fit_ended_at - fit_started_at)
    else:
        seconds["startup"] += max(0.0, ordered[0]["began_at"] - fit_started_at)
        seconds["startup"] += max(0.0, fit_ended_at - ordered[-1]["last_at"])
    for i, attempt in enumerate(ordered):
        for cause, value in attempt["seconds"].items():
            seconds[cause] += value
        for cause, count in attempt.get("steps", {}).items():
            steps[cause] += count
        if i + 1 < len(ordered):
            gap = max(0.0, ordered[i + 1]["began_at"] - attempt["last_at"])
            seconds["preemption" if hosts_lost else "failure"] += gap
    saves = sum(int(a.get("saves", 0)) for a in ordered)
    step_s = seconds["productive"] / steps["productive"] if steps.get("productive") else None
    return {
        "seconds": {cause: round(value, 3) for cause, value in seconds.items() if value > 0},
        "steps": dict(steps),
        "checkpoint": {
            "saves": saves,
            "mean_save_s": round(seconds["checkpoint"] / saves, 3) if saves else None,
            "mean_step_s": None if step_s is None else round(step_s, 4),
            "every": checkpoint_every,
            "at_risk_s": round(checkpoint_every * step_s, 3) if checkpoint_every and step_s else None,
        },
        "attempts": len(ordered),
        "recorded": [{"from": int(a["start_step"]), "to": int(a["step"])} for a in ordered],
        "fit_started_at": fit_started_at,
        "fit_ended_at": fit_ended_at,
    }
