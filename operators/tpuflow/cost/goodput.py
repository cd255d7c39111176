"""Goodput: every billed chip-second of a slice accounted for by cause, from what the run recorded.

A slice's billed span (created -> deleted, the ledger's) is cut at every recorded boundary: its pool being
provisioned (GKE's create operation), its Ray cluster coming up, and each piece of work run on it (the
``work_span`` a task pushed: a Ray job's start and end by Ray's clock, a Serve endpoint from its deploy
until the slice goes). Where work overlaps (prep beside the preflight), the instant goes to the work that
uses the chips (`PRIORITY`); an instant with nothing on the slice is ``idle``. A training job's own time
is then split by what its train loop measured (tpuflow_driver.goodput: compile, productive and redone
steps, data wait, checkpoints, restore, preemption); a loop that measures nothing stays ``training``.

Goodput is the share of billed chip-seconds spent on productive steps (steps that took the model further
than any earlier attempt), as Google's ML Goodput defines it. Evaluation, serving and a generic Ray job are
work the slice was held for, neither goodput nor badput; everything else is badput. Pure module.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

# a cut of the span goes to the first of these covering it; nothing covering it: idle
PRIORITY = (
    "training",
    "evaluation",
    "serving",
    "preflight",
    "job",
    "data_prep",
    "cluster_start",
    "provisioning",
)
IDLE = "idle"
PRODUCTIVE = "productive"
NEITHER = frozenset({"evaluation", "serving", "job"})  # work the slice was held for: not badput
LABELS = {
    "provisioning": "provisioning",
    "cluster_start": "cluster start",
    "data_prep": "data prep on the slice",
    "preflight": "preflight",
    "startup": "job start-up",
    "compile": "compile / first step",
    "data_wait": "data wait",
    "productive": "productive steps",
    "checkpoint": "checkpoint save",
    "restore": "restore after a restart",
    "preemption": "preemption",
    "failure": "failure restart",
    "redone": "work redone",
    "training": "training (not split: the loop keeps no StepClock)",
    "evaluation": "evaluation",
    "serving": "serving",
    "job": "other Ray jobs",
    "idle": "held idle",
}


def _rank(cause: str) -> int:
    return PRIORITY.index(cause) if cause in PRIORITY else PRIORITY.index("job")


def segments(start: float, end: float, intervals: Iterable[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """[start, end] cut into consecutive (from, to, cause) pieces: each piece the highest-priority interval
    covering it, else idle; neighbours with the same cause merged."""
    clipped = [(max(a, start), min(b, end), c) for a, b, c in intervals if min(b, end) > max(a, start)]
    cuts = sorted({start, end, *(a for a, _, _ in clipped), *(b for _, b, _ in clipped)})
    out: list[tuple[float, float, str]] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        covering = [c for lo, hi, c in clipped if lo <= a and hi >= b]
        cause = min(covering, key=_rank) if covering else IDLE
        if out and out[-1][2] == cause and out[-1][1] == a:
            out[-1] = (out[-1][0], b, cause)
        else:
            out.append((a, b, cause))
    return out


def split_training(seconds: float, breakdown: Mapping[str, float] | None) -> dict[str, float]:
    """A training job's visible seconds split as its loop measured them; what the loop did not see (the Ray
    job and its worker group starting and stopping) is ``startup``. Unmeasured: all ``training``."""
    if not breakdown:
        return {"training": seconds}
    measured = {k: float(v) for k, v in breakdown.items() if float(v) > 0}
    total = sum(measured.values())
    if total <= 0:
        return {"training": seconds}
    if total > seconds:  # clocks of different hosts disagree by a little: scale into the job's span
        return {k: v * seconds / total for k, v in measured.items()}
    measured["startup"] = measured.get("startup", 0.0) + seconds - total
    return measured


def slice_timeline(
    created_at: float | None,
    deleted_at: float | None,
    works: Iterable[Mapping[str, Any]],
    *,
    now: float,
    provisioned_at: float | None = None,
    cluster_ready_at: float | None = None,
) -> dict[str, Any]:
    """One slice's seconds by cause, and its segments (for the chart).

    ``works``: ``{"cause", "started_at", "ended_at", "breakdown"}`` (ended_at None: until the slice goes;
    breakdown: a training job's loop-measured seconds). ``provisioned_at``: when its nodes were ready (GKE's
    create operation's end); the cluster starts from there until ``cluster_ready_at``, or, unknown, until
    the first work starts.
    """
    if created_at is None:
        return {"seconds": {}, "segments": []}
    end = deleted_at if deleted_at is not None else now
    works = [w for w in works if w.get("started_at") is not None]
    intervals: list[tuple[float, float, str]] = []
    ready = provisioned_at if provisioned_at is not None else created_at
    intervals.append((created_at, ready, "provisioning"))
    first_work = min((float(w["started_at"]) for w in works), default=end)
    intervals.append((ready, cluster_ready_at if cluster_ready_at is not None else first_work, "cluster_start"))
    for w in works:
        stop = float(w["ended_at"]) if w.get("ended_at") is not None else end
        intervals.append((float(w["started_at"]), stop, str(w["cause"])))
    cut = segments(created_at, end, intervals)
    seconds: dict[str, float] = defaultdict(float)
    for a, b, cause in cut:
        if cause != "training":
            seconds[cause] += b - a
    for w in (w for w in works if w["cause"] == "training"):
        stop = float(w["ended_at"]) if w.get("ended_at") is not None else end
        # the part of this job the cut gave to training (a job is never hidden by higher-priority work)
        shown = sum(max(0.0, min(b, stop) - max(a, float(w["started_at"]))) for a, b, c in cut if c == "training")
        for cause, value in split_training(shown, w.get("breakdown")).items():
            seconds[cause] += value
    return {
        "seconds": {k: round(v, 3) for k, v in seconds.items() if round(v, 3) > 0},
        "segments": [[round(a, 3), round(b, 3), c] for a, b, c in cut],
    }


def run_goodput(slices: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's chip-seconds by cause over its slices (each ``{"chips", "timeline"}``), goodput and the
    badput causes, largest first."""
    chip_seconds: dict[str, float] = defaultdict(float)
    for s in slices:
        for cause, value in (s.get("timeline") or {}).get("seconds", {}).items():
            chip_seconds[cause] += int(s["chips"]) * float(value)
    billed = sum(chip_seconds.values())
    unsplit = chip_seconds.get("training", 0.0) > 0
    badput = sorted(
        ((c, v) for c, v in chip_seconds.items() if c != PRODUCTIVE and c not in NEITHER and c != "training"),
        key=lambda cv: -cv[1],
    )
    return {
        "chip_seconds": {k: round(v, 3) for k, v in sorted(chip_seconds.items(), key=lambda kv: -kv[1])},
        "billed_chip_seconds": round(billed, 3),
        # None when some training time was not split (a loop without a StepClock): its productive part is unknown
        "goodput": None if billed <= 0 or unsplit else round(chip_seconds.get(PRODUCTIVE, 0.0) / billed, 4),
        "badput": [{"cause": c, "chip_seconds": round(v, 3), "share": round(v / billed, 4)} for c, v in badput]
        if billed > 0
        else [],
    }


def summary_line(goodput: Mapping[str, Any]) -> str:
    """``goodput 71 %; badput: held idle 12 %, job start-up 9 %`` (the top two badput causes)."""
    top = [b for b in goodput.get("badput", []) if b["share"] >= 0.01][:2]
    causes = ", ".join(f"{LABELS.get(b['cause'], b['cause'])} {b['share'] * 100:.0f} %" for b in top)
    value = goodput.get("goodput")
    if value is None:
        head = (
            "goodput not measured (a training loop without a StepClock)"
            if goodput.get("billed_chip_seconds")
            else ("goodput not measured (no slice time billed)")
        )
    else:
        head = f"goodput {value * 100:.0f} %"
    return f"{head}; top badput: {causes}" if causes else head


def ledger_lines(ledger: Any) -> list[str]:
    """What ``tpuflow demo`` prints of a run's ledger: chip-hours billed, then goodput and its top badput."""
    if not isinstance(ledger, Mapping) or "chip_hours" not in ledger:
        return []
    lines = [f"{'chip-hours billed:':<20}{ledger['chip_hours']:.4f} over {len(ledger.get('slices', []))} slice(s)"]
    if isinstance(ledger.get("goodput"), Mapping):
        lines.append(summary_line(ledger["goodput"]))
    return lines
