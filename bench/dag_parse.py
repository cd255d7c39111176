"""How much the project's DAG files cost the dag processor, as a ratio to a trivial DAG file.

Run: .venv/bin/python bench/dag_parse.py [--repeat 20]
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

REPO = Path(__file__).resolve().parents[1]
BASELINE = '''
from datetime import datetime
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
with DAG("baseline", schedule=None, start_date=datetime(2026, 1, 1)):
    EmptyOperator(task_id="t")
'''
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
    runs = [float(subprocess.run([sys.executable, "-c", TIMER, str(path)], capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()[-1]) for _ in range(repeat)]
    return statistics.median(runs)


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
