"""The bench's frame: the measure registry, the shared run context (one local Ray cluster, data,
a checkpoint), process bookkeeping and the result record."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "workloads"
JOBS = Path(__file__).resolve().parent / "jobs"
DATE = "2026-01-01"


@dataclass
class Result:
    """One row of latest.json. `ratio` is value / baseline unless the measure defines it otherwise
    (then `ratio_means` says how); `met` compares the goal's subject (`goal_on`: "value" or "ratio")."""

    name: str
    value: float | None
    unit: str
    baseline: float | None
    ratio: float | None
    goal: str
    met: bool | None
    variant: str = ""
    baseline_is: str = ""
    ratio_means: str = "value / baseline"
    notes: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)  # for the charts, not written to the table

    def row(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("name", "value", "unit", "baseline", "ratio", "goal", "met")}
        out.update(variant=self.variant, baseline_is=self.baseline_is, ratio_means=self.ratio_means,
                   notes=self.notes, details=self.details)  # fmt: skip
        return {k: _clean(v) for k, v in out.items()}


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else round(v, 4)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def goal_check(subject: float | None, op: str, bound: float) -> bool | None:
    if subject is None or math.isnan(subject):
        return None
    return subject <= bound if op == "<=" else subject >= bound


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    data = sorted(values)
    k = max(0, min(len(data) - 1, math.ceil(q / 100 * len(data)) - 1))
    return data[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


# --- registry ---------------------------------------------------------------------------------


@dataclass
class Measure:
    name: str
    fn: Callable[[Context], list[Result]]
    in_quick: bool
    produces: tuple[str, ...]
    in_full: bool = True  # False: only with --only or --serving (make bench-serving)
    device: bool = False  # True: only with --device (rows run on a TPU chip; bench/device.py)


MEASURES: dict[str, Measure] = {}


def measure(
    name: str, *, quick: bool = True, full: bool = True, produces: tuple[str, ...] = (), device: bool = False
) -> Callable:
    """Register a measure; `produces` names extra result rows it writes (selectable with --only too).
    quick: in the --quick set; full: in the default (make bench) set, else only in --serving / --only."""

    def wrap(fn: Callable[[Context], list[Result]]) -> Callable[[Context], list[Result]]:
        MEASURES[name] = Measure(
            name, fn, quick and full and not device, (name, *produces), full and not device, device
        )
        return fn

    return wrap


# --- processes --------------------------------------------------------------------------------


def exit_on_sigterm() -> None:
    """SIGTERM unwinds the bench like Ctrl-C does (exit 143): every `finally` and context manager on the way
    out stops what it started (local Airflow, Ray clusters), where Python's default would end the process
    on the spot and leave them running."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def pids_with_marker(marker: str) -> list[int]:
    """Pids whose command line or environment mentions `marker` (a temp dir unique to this run)."""
    found, me = [], os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            text = (entry / "cmdline").read_bytes()
            if marker.encode() not in text:
                text = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in text:
            found.append(int(entry.name))
    return found


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        return "?"


def kill_pids(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM, wait on exactly these pids, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + timeout
        while time.time() < deadline and any(pid_alive(p) for p in pids):
            for p in pids:
                try:
                    os.waitpid(p, os.WNOHANG)
                except ChildProcessError:
                    pass
            time.sleep(0.1)
        if not any(pid_alive(p) for p in pids):
            return


# --- the run context ----------------------------------------------------------------------------


class Context:
    """What the measures share in one run: a work dir, one small local Ray cluster, data, a checkpoint.

    Everything started here is stopped by `close()` (the cluster by its own pids, never `ray stop`).
    """

    def __init__(self, quick: bool, results_dir: Path, *, profile: bool = False) -> None:
        self.quick = quick
        self.profile = profile  # the measures' optional profiles (--profile)
        self.results_dir = results_dir
        # short: Ray's unix socket paths under temp dirs are length-limited
        self.work = Path(tempfile.mkdtemp(prefix="tpb-", dir="/tmp"))
        self._cluster: Any = None
        self._cluster_error: Exception | None = None
        self._data: dict[str, str] | None = None
        self._checkpoint: str | None = None
        self.log_lines: list[str] = []
        self.shared: dict[str, Any] = {}  # what several measures use, made once per run (the plain pipeline)

    def log(self, msg: str) -> None:
        line = f"[bench {time.strftime('%H:%M:%S')}] {msg}"
        self.log_lines.append(line)
        print(line, flush=True)

    # --- the shared cluster: a head only, with enough logical CPUs for jobs, Serve and 2 train workers
    def cluster(self) -> Any:
        if self._cluster is None:
            from tpuflow.local.cluster import LocalRayCluster

            if self._cluster_error is not None:  # one failed start per run: do not pay it again per measure
                raise RuntimeError(f"the shared local Ray cluster did not start: {self._cluster_error}")
            t = time.perf_counter()
            try:
                self._cluster = LocalRayCluster.start(None, "bench", self.work / "clusters", head_cpus=6, timeout=300)
            except Exception as err:
                self._cluster_error = err
                raise
            self.log(f"shared local Ray cluster up in {time.perf_counter() - t:.1f}s at {self._cluster.dashboard_url}")
        return self._cluster

    def cluster_info(self) -> dict[str, Any]:
        return self.cluster().connection_info()

    def hook(self, dashboard_url: str | None = None) -> Any:
        from tpuflow.rayjob.hooks import RayJobHook

        info = dict(self.cluster_info())
        if dashboard_url:
            info["dashboard_url"] = dashboard_url
        return RayJobHook(cluster=info)

    def run_job(
        self,
        entrypoint: str,
        *,
        working_dir: Path = WORKLOADS,
        timeout: float = 900,
        env: dict[str, str] | None = None,
        name: str = "job",
    ) -> tuple[dict[str, Any], str]:
        """Submit a Ray job through the product's hook, wait for it; returns (job info, logs)."""
        hook = self.hook()
        sid = f"bench-{name}-{time.time_ns() % 10**12}"
        runtime_env: dict[str, Any] = {
            "working_dir": str(working_dir),
            "env_vars": {"JAX_PLATFORMS": "cpu", **(env or {})},
        }
        hook.submit_job(entrypoint, sid, runtime_env=runtime_env)
        deadline = time.time() + timeout
        status = ""
        while time.time() < deadline:
            status = hook.get_job_status(sid)
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            time.sleep(0.5)
        else:
            hook.stop_job(sid)
        logs = hook.get_job_logs(sid)
        info = hook.get_client().get_job_info(sid)
        if status != "SUCCEEDED":
            raise RuntimeError(f"Ray job {entrypoint!r} ended {status or 'by timeout'}:\n{logs[-3000:]}")
        return {"start_time": info.start_time, "end_time": info.end_time, "submission_id": sid}, logs

    def data(self) -> dict[str, str]:
        """The demo's data, written by the product's prep entrypoint as a Ray job on the shared cluster."""
        if self._data is None:
            from tpuflow.rayjob.hooks import parse_result

            out = self.work / "data" / DATE
            _, logs = self.run_job(f"python -m addition.prep --output-dir {out} --date {DATE}", name="prep")
            result = parse_result(logs)
            self._data = {"train": result["train_path"], "heldout": result["heldout_path"]}
        return self._data

    def checkpoint(self) -> str:
        """One in-process JAX training run with the product defaults (as tests/workloads does)."""
        if self._checkpoint is None:
            if str(WORKLOADS) not in sys.path:
                sys.path.insert(0, str(WORKLOADS))
            from addition import checkpoint as ckpt
            from addition import data, train_jax
            from addition.training import model_config, resolve_config

            cfg = resolve_config({})
            spec, model = model_config(cfg)
            train = data.generate(DATE, "train", data.default_num_train(spec, 200), num_heldout=200)
            params, metrics = train_jax.train_local(train["tokens"], cfg, log=lambda _m: None)
            directory = self.work / "ckpt"
            ckpt.save(directory, ckpt.Meta("jax", metrics["step"], metrics["epoch"], model, spec), params)
            self._checkpoint = str(directory)
        return self._checkpoint

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None
        leftovers = [p for p in pids_with_marker(str(self.work)) if pid_alive(p)]
        if leftovers:
            names = [_comm(p) for p in leftovers]
            self.log(f"stopping {len(leftovers)} process(es) of this run still alive after its cluster stopped: "
                     f"{list(zip(leftovers, names, strict=True))}")  # fmt: skip
            kill_pids(leftovers)
        shutil.rmtree(self.work, ignore_errors=True)


@contextmanager
def spawned(
    cmd: list[str], *, env: dict[str, str] | None = None, log: Path | None = None, cwd: Path | None = None
) -> Iterator[subprocess.Popen]:
    """A child in its own process group, stopped (group SIGTERM, then SIGKILL) on the way out."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
    try:
        yield proc
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        if log:
            out.close()  # type: ignore[union-attr]


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))
