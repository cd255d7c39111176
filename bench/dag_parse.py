"""dag_parse_ratio: how much each of the project's DAG files costs the dag processor, as a ratio to
a trivial DAG file (goal: <= 1.5).

Run: .venv/bin/python -m bench --only dag_parse_ratio   (or python -m bench.dag_parse [--repeat 20])
Each file is executed in a fresh interpreter that has already imported airflow.sdk (as the
dag processor has), so only the DAG file's own cost is timed. The baseline is a one-task DAG
written to a temp file and timed in the same run, because this machine is noisy.
"""

from __future__ import annotations

import argparse
import statistics
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
import importlib.util, sys, time
import airflow.sdk
path = sys.argv[1]
t = time.perf_counter()
spec = importlib.util.spec_from_file_location("dagfile", path)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(time.perf_counter() - t)
"""


def parse_seconds(path: Path, repeat: int) -> float:
    runs = [
        float(
            subprocess.run([sys.executable, "-c", TIMER, str(path)], capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(repeat)
    ]
    return statistics.median(runs)


@measure("dag_parse_ratio")
def dag_parse_ratio(ctx: Context) -> list[Result]:
    repeat = 3 if ctx.quick else 10
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline_dag.py"
        baseline.write_text(BASELINE)
        base = parse_seconds(baseline, repeat)
        for dag_file in sorted((REPO / "dags").glob("*.py")):
            cost = parse_seconds(dag_file, repeat)
            ctx.log(
                f"{dag_file.name}: {cost * 1000:.1f} ms = {cost / base:.2f} x the one-task DAG ({base * 1000:.1f} ms)"
            )
            results.append(Result(
                "dag_parse_ratio", cost * 1000, "ms", base * 1000, cost / base, f"ratio <= {GOAL}",
                goal_check(cost / base, "<=", GOAL), variant=dag_file.name,
                baseline_is="a one-task DAG file, parsed the same way (fresh interpreter after import airflow.sdk)",
                notes=f"median of {repeat}",
            ))  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline_dag.py"
        baseline.write_text(BASELINE)
        base = parse_seconds(baseline, args.repeat)
        print(f"baseline one-task DAG: {base * 1000:.1f} ms (median of {args.repeat})")
        for dag_file in sorted((REPO / "dags").glob("*.py")):
            cost = parse_seconds(dag_file, args.repeat)
            print(f"{dag_file.name}: {cost * 1000:.1f} ms = {cost / base:.2f} x baseline")


if __name__ == "__main__":
    main()
