"""dag_parse_ratio: how much each of the project's DAG files costs the dag processor, as a ratio to
a trivial DAG file (goal: <= 1.5).

Run: .venv/bin/python -m bench --only dag_parse_ratio   (or python -m bench.dag_parse [--repeat 20])
Each file is executed in a fresh process that has already imported airflow.sdk (as the dag
processor's parsing process has): one interpreter imports airflow.sdk once, then forks a child per
sample, which parses one file and reports the time, so each sample starts from the same state and
only the DAG file's own cost is timed (and the run pays for one Airflow import, not one per sample).
The baseline is a one-task DAG written to a temp file and timed in the same run, the files in turn,
because this machine is noisy.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.core import REPO, Context, Result, goal_check, measure

GOAL = 1.5
BASELINE = """
from datetime import datetime
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
with DAG("baseline", schedule=None, start_date=datetime(2026, 1, 1)):
    EmptyOperator(task_id="t")
"""
TIMER = """
import importlib.util, os, statistics, sys, time
import airflow.sdk
paths, repeat = sys.argv[2:], int(sys.argv[1])
samples = {p: [] for p in paths}
for _ in range(repeat):
    for path in paths:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            t = time.perf_counter()
            spec = importlib.util.spec_from_file_location("dagfile", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            os.write(w, repr(time.perf_counter() - t).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            out = f.read()
        _, status = os.waitpid(pid, 0)
        if status or not out:
            sys.exit(f"parsing {path} failed (status {status})")
        samples[path].append(float(out))
for path in paths:
    print(path, statistics.median(samples[path]))
"""


def parse_seconds(paths: list[Path], repeat: int) -> dict[Path, float]:
    """The median parse time of each file (`repeat` samples each, forked from one interpreter)."""
    out = subprocess.run(
        [sys.executable, "-c", TIMER, str(repeat), *map(str, paths)], capture_output=True, text=True, check=True
    ).stdout
    medians = dict(line.rsplit(" ", 1) for line in out.strip().splitlines())
    return {path: float(medians[str(path)]) for path in paths}


@measure("dag_parse_ratio")
def dag_parse_ratio(ctx: Context) -> list[Result]:
    repeat = 5 if ctx.quick else 20
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline_dag.py"
        baseline.write_text(BASELINE)
        dag_files = sorted((REPO / "dags").glob("*.py"))
        costs = parse_seconds([baseline, *dag_files], repeat)
        base = costs.pop(baseline)
        for dag_file in dag_files:
            cost = costs[dag_file]
            ctx.log(
                f"{dag_file.name}: {cost * 1000:.1f} ms = {cost / base:.2f} x the one-task DAG ({base * 1000:.1f} ms)"
            )
            results.append(Result(
                "dag_parse_ratio", cost * 1000, "ms", base * 1000, cost / base, f"ratio <= {GOAL}",
                goal_check(cost / base, "<=", GOAL), variant=dag_file.name,
                baseline_is="a one-task DAG file, parsed the same way (fresh interpreter after import airflow.sdk)",
                notes=f"median of {repeat}, each a child forked after import airflow.sdk",
            ))  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline_dag.py"
        baseline.write_text(BASELINE)
        dag_files = sorted((REPO / "dags").glob("*.py"))
        costs = parse_seconds([baseline, *dag_files], args.repeat)
        base = costs.pop(baseline)
        print(f"baseline one-task DAG: {base * 1000:.1f} ms (median of {args.repeat})")
        for dag_file in dag_files:
            cost = costs[dag_file]
            print(f"{dag_file.name}: {cost * 1000:.1f} ms = {cost / base:.2f} x baseline")


if __name__ == "__main__":
    main()
