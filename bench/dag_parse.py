"""dag_parse_ratio: how much each of the project's DAG files costs the dag processor, as a ratio to the
same DAG written by hand with stock operators (goal: <= 1.3).

Run: .venv/bin/python -m bench --only dag_parse_ratio   (or python -m bench.dag_parse [--repeat 20])
Each file is executed in a fresh process that has already imported airflow.sdk (as the dag
processor's parsing process has): one interpreter imports airflow.sdk once, then forks a child per
sample, which parses one file and reports the time, so each sample starts from the same state and
only the DAG file's own cost is timed (and the run pays for one Airflow import, not one per sample).
The baseline of each file is what its user would otherwise write: a DAG with the same dag_id and schedule, the
same tasks (stock EmptyOperators with the same task ids, setup / teardown roles and dependencies; a task that asks
a person, Airflow's own ApprovalOperator) and the same Params (defaults and schemas), generated from the parsed
DAG (``same_shape_source``) and timed in the same run, the files in turn, because this machine is noisy. A
one-task DAG is timed too, for the details. The project's modules are byte-compiled first, as Airflow's own are
(``compile_project``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.core import REPO, Context, Result, goal_check, measure

GOAL = 1.3
ONE_TASK = """
from datetime import datetime
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
with DAG("baseline", schedule=None, start_date=datetime(2026, 1, 1)):
    EmptyOperator(task_id="t")
"""
# Prints, for each DAG of a file, what a hand-written copy needs: tasks (id, role, upstream ids) and Params.
SHAPE = """
import importlib.util, json, sys
import airflow.sdk
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import DAG
spec = importlib.util.spec_from_file_location("dagfile", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
dags = [v for v in vars(module).values() if isinstance(v, DAG)]
print(json.dumps([{
    "dag_id": dag.dag_id,
    "schedule": dag.schedule if isinstance(dag.schedule, str) or dag.schedule is None else str(dag.schedule),
    "params": {k: {"default": dag.params.get_param(k).value, "schema": dag.params.get_param(k).schema,
                   "description": dag.params.get_param(k).description} for k in dag.params},
    "tasks": [{"task_id": t.task_id, "setup": t.is_setup, "teardown": t.is_teardown,
               "approval": isinstance(t, ApprovalOperator), "upstream": sorted(t.upstream_task_ids)}
              for t in dag.tasks],
} for dag in dags], default=str))
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


def dag_shapes(dag_file: Path) -> list[dict[str, Any]]:
    """The DAGs a file defines, as SHAPE prints them (parsed in a child, so nothing stays loaded here)."""
    out = subprocess.run([sys.executable, "-c", SHAPE, str(dag_file)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def same_shape_source(shapes: list[dict[str, Any]]) -> str:
    """A DAG file that defines the same DAGs by hand: the same ids, roles, edges, schedule and Params, each task
    an EmptyOperator, but a person's approval Airflow's own ApprovalOperator (a DAG written by hand asks a person
    with it too, and pays for its import)."""
    lines = [
        "from datetime import datetime",
        "from airflow.sdk import DAG, Param",
        "from airflow.providers.standard.operators.empty import EmptyOperator",
    ]
    if any(task["approval"] for shape in shapes for task in shape["tasks"]):
        lines.append("from airflow.providers.standard.operators.hitl import ApprovalOperator")
    for index, shape in enumerate(shapes):
        params = {
            name: f"Param({p['default']!r}, description={p['description']!r}, **{p['schema']!r})"
            for name, p in shape["params"].items()
        }
        lines.append(
            f"with DAG({shape['dag_id']!r}, schedule={shape['schedule']!r}, start_date=datetime(2026, 1, 1), "
            "catchup=False, "
            f"params={{{', '.join(f'{k!r}: {v}' for k, v in params.items())}}}) as dag_{index}:"
        )
        lines.append("    t = {}")
        for task in shape["tasks"]:
            role = ".as_setup()" if task["setup"] else ".as_teardown()" if task["teardown"] else ""
            kind = "ApprovalOperator(subject='Approve?', " if task["approval"] else "EmptyOperator("
            lines.append(f"    t[{task['task_id']!r}] = {kind}task_id={task['task_id']!r}){role}")
        for task in shape["tasks"]:
            for up in task["upstream"]:
                lines.append(f"    t[{up!r}] >> t[{task['task_id']!r}]")
        lines.append("    pass")
    return "\n".join(lines) + "\n"


def compile_project() -> None:
    """Byte-compile the project's modules, as an installed package is (pip compiles a wheel's modules) and
    as Python caches them on a machine that writes bytecode: where PYTHONDONTWRITEBYTECODE is set (this
    repository's machines set it) every parse would compile tpuflow from source while the stock-operator
    baseline's Airflow modules load from site-packages' bytecode, which times the compiler, not the DAG."""
    folders = [str(REPO / name) for name in ("operators", "workloads", "plugins") if (REPO / name).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], check=True, stdout=subprocess.DEVNULL)


def parse_seconds(paths: list[Path], repeat: int) -> dict[Path, float]:
    """The median parse time of each file (`repeat` samples each, forked from one interpreter), with the
    project's modules byte-compiled first (compile_project)."""
    compile_project()
    out = subprocess.run(
        [sys.executable, "-c", TIMER, str(repeat), *map(str, paths)], capture_output=True, text=True, check=True
    ).stdout
    medians = dict(line.rsplit(" ", 1) for line in out.strip().splitlines())
    return {path: float(medians[str(path)]) for path in paths}


def costs_with_baselines(tmp: Path, repeat: int) -> tuple[dict[Path, tuple[float, float]], float]:
    """{dag file: (its parse time, its same-shape baseline's)}, and the one-task DAG's time."""
    one_task = tmp / "one_task_dag.py"
    one_task.write_text(ONE_TASK)
    dag_files = sorted((REPO / "dags").glob("*.py"))
    baselines = {}
    for dag_file in dag_files:
        baselines[dag_file] = tmp / f"by_hand_{dag_file.name}"
        baselines[dag_file].write_text(same_shape_source(dag_shapes(dag_file)))
    costs = parse_seconds([one_task, *dag_files, *baselines.values()], repeat)
    return {f: (costs[f], costs[baselines[f]]) for f in dag_files}, costs[one_task]


@measure("dag_parse_ratio")
def dag_parse_ratio(ctx: Context) -> list[Result]:
    repeat = 5 if ctx.quick else 20
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        costs, one_task = costs_with_baselines(Path(tmp), repeat)
    for dag_file, (cost, base) in costs.items():
        ctx.log(f"{dag_file.name}: {cost * 1000:.1f} ms = {cost / base:.2f} x by hand ({base * 1000:.1f} ms)")
        results.append(Result(
            "dag_parse_ratio", cost * 1000, "ms", base * 1000, cost / base, f"ratio <= {GOAL}",
            goal_check(cost / base, "<=", GOAL), variant=dag_file.name,
            baseline_is="the same DAG by hand: stock EmptyOperators (Airflow's ApprovalOperator for a task that asks "
            "a person) with the same task ids, setup/teardown roles, dependencies, schedule and Params, parsed the same "
            "way (fresh interpreter after import airflow.sdk)",
            notes=f"median of {repeat}, each a child forked after import airflow.sdk",
            details={"one_task_dag_ms": round(one_task * 1000, 2), "ratio_to_one_task_dag": round(cost / one_task, 2)},
        ))  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        costs, one_task = costs_with_baselines(Path(tmp), args.repeat)
    print(f"one-task DAG: {one_task * 1000:.1f} ms (median of {args.repeat})")
    for dag_file, (cost, base) in costs.items():
        print(f"{dag_file.name}: {cost * 1000:.1f} ms = {cost / base:.2f} x by hand ({base * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
