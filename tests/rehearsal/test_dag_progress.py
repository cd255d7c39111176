"""The progress lines `tpuflow demo` and `tpuflow run` print from `airflow dags test`'s log (tpuflow_rehearsal.dag_progress),
fed with lines in Airflow 3.3's own format."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tpuflow_rehearsal.dag_progress import DagTestProgress, follow

T = "2026-12-07T09:47:12.464992Z [info     ] "


def start(task: str, index: int = -1) -> str:
    return f"{T}[DAG TEST] starting task_id={task} map_index={index} [airflow.sdk.definitions.dag] loc=dag.py:1501"


def end(task: str, index: int = -1) -> str:
    return f"{T}[DAG TEST] end task task_id={task} map_index={index} [airflow.sdk.definitions.dag] loc=dag.py:1563"


def state(new: str) -> str:
    return (
        f"{T}Task instance state updated    [airflow.api_fastapi.execution_api.routes.task_instances] "
        f"correlation_id=01a2 loc=task_instances.py:485 new_state={new} rows_affected=1 ti_id=01a2"
    )


def step(n: int, total: int) -> str:
    return (
        f"{T}[ray job] (RayTrainWorker pid=812) [train_jax] step {n}/{total} epoch 1 loss 0.{n:04d} "
        "(0.12 s/step) [tpuflow.rayjob.triggers.RayJobTrigger]"
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def feed(progress: DagTestProgress, clock: Clock, *lines: str, every: float = 1.0) -> list[str]:
    out = []
    for line in lines:
        clock.now += every
        out += progress.feed(line)
    return out


def test_a_line_per_task_with_its_final_state_and_time_a_deferral_included() -> None:
    clock = Clock()
    progress = DagTestProgress(clock=clock)
    said = feed(
        progress,
        clock,
        start("check_params"),
        state("success"),
        end("check_params"),
        start("prep"),
        state("deferred"),
        f"{T}[DAG TEST] running trigger in line",
        f"{T}[ray job] wrote 20000 examples",
        state("success"),
        end("prep"),
        start("shard", 3),
        state("success"),
        end("shard", 3),
    )
    assert len(said) == 3, said
    assert said[0].endswith("check_params                     success in 2s") and said[0].startswith("[    3s]")
    assert "prep" in said[1] and said[1].endswith("success in 5s"), said
    assert "shard[3]" in said[2] and "success" in said[2]
    assert progress.failure_lines() == []


def test_a_failed_task_keeps_its_last_log_lines_for_the_failure_message() -> None:
    clock = Clock()
    progress = DagTestProgress(clock=clock)
    first_try = [start("train"), "loading the data", "Task failed with exception: first try", state("up_for_retry")]
    last_try = [start("train"), "loading the data", "ValueError: the loss is nan", state("failed")]
    said = feed(progress, clock, *first_try, end("train"), *last_try, end("train"), start("stop_cluster"))
    assert [line.split()[-3] for line in said] == ["up_for_retry", "failed"], said
    lines = progress.failure_lines()
    assert lines[0] == "--- the last 3 log lines of train (library frames left out) ---" and lines[-1] == "---", lines
    assert "ValueError: the loss is nan" in lines and "Task failed with exception: first try" not in lines, lines
    assert not any("[DAG TEST]" in line for line in lines), lines


def test_training_steps_are_said_once_a_quarter() -> None:
    clock = Clock()
    progress = DagTestProgress(clock=clock)
    said = feed(progress, clock, start("train"), *(step(n, 1500) for n in range(100, 1501, 100)), state("success"))
    steps = [line.split("step ")[1].split(",")[0] for line in said]
    assert steps == ["100/1500", "400/1500", "800/1500", "1200/1500", "1500/1500"], said
    assert said[0].endswith("train: step 100/1500, loss 0.0100"), said


def test_follow_reads_the_log_as_it_grows_until_the_run_ends(tmp_path: Path) -> None:
    log = tmp_path / "dags-test.log"
    log.write_text("")
    said: list[str] = []
    done = threading.Event()
    reader = threading.Thread(target=follow, args=(log, done, said.append, DagTestProgress()))
    reader.start()
    with log.open("a") as out:
        out.write(start("prep") + "\n" + state("success") + "\n")
        out.flush()
        time.sleep(0.7)
        out.write(end("prep"))  # the last line without its newline: the run ended mid-line
    done.set()
    reader.join(10)
    assert not reader.is_alive()
    assert len(said) == 1 and "prep" in said[0] and "success" in said[0], said


FAILING_DAG = '''\
"""Airflow DAG: a team's two-task check (not tpuflow's)."""
from airflow.sdk import DAG, task

with DAG("acme_two_steps", schedule=None) as dag:

    @task
    def fetch() -> int:
        return 7

    @task(retries=0)
    def check(value: int) -> None:
        print("acme: checking", value, flush=True)
        raise ValueError("acme: the value is odd")

    check(fetch())
'''


@pytest.mark.slow
def test_dags_test_prints_a_line_per_task_and_the_failed_tasks_last_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tpuflow demo`'s and `tpuflow run`'s runner on a DAG of a team's: Airflow's whole log goes to the file, the
    terminal gets a line per task and, the run having failed, the failed task's own last lines."""
    from tpuflow_rehearsal.dag_progress import airflow_log
    from tpuflow_rehearsal.demo import dags_test, supervised
    from tpuflow_rehearsal.demo_env import demo_env

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "acme_two_steps.py").write_text(FAILING_DAG)
    home = tmp_path / "airflow"
    log = airflow_log(home, "2026-12-07")
    with supervised("acme") as sup:
        env = {**demo_env(home, tmp_path / "outputs", dags_folder=dags), **sup.env()}
        code, _ = dags_test(sup, env, "acme_two_steps", "2026-12-07", {}, who="acme", num_slices=1, log=log)
    out, err = capsys.readouterr()
    assert code != 0
    lines = out.splitlines()
    assert f"acme: Airflow's log: {log}" in lines, out
    (fetched,) = [line for line in lines if " fetch " in line]
    (checked,) = [line for line in lines if " check " in line]
    assert "success in" in fetched and "failed in" in checked, out
    assert len(lines) <= 4, out  # the run's line, the log's path, one per task: Airflow's own lines are in the file
    assert "--- the last" in err and "ValueError: acme: the value is odd" in err, err
    assert "acme: checking 7" in err and 'acme_two_steps.py", line 13, in check' in err, err
    assert "site-packages" not in err, err  # Airflow's own frames are in the file, not here
    whole = log.read_text()
    assert "[DAG TEST] starting task_id=check" in whole and "ValueError: acme: the value is odd" in whole
