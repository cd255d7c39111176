"""A run keeps the backend it started on: a changed Variable ``tpuflow_backend`` waits for the runs in flight.

The backend decides the DAG's shape, and the shape is read at every parse: by the DAG processor (whose latest
version the scheduler applies to running runs too, for a bundle without versions, e.g. the DAGs folder) and by
every task's worker. Read afresh, a changed Variable would re-shape a running run mid-way: its local cluster's
stop task removed, GKE tasks added to a run that holds no node pool. So each DAG records the backend its runs
were started on in an Airflow Variable of its own (``tpuflow_backend_pinned.<dag_id>``; Variables are an
admin's, like ``tpuflow_backend``), and a parse keeps that backend while any task of the DAG is unfinished (no
state yet, queued, running, deferred, up for retry, ...): the runs that exist then were made with that shape.
Once none is, the parse takes the Variable and records it: the new backend applies to every run from then on.

Both counts go through Airflow's own channel to the metadata DB (the supervisor of the DAG processor or of the
task runner). A parse outside Airflow's processes (a test, ``python dag.py``, ``airflow dags test``'s first
parse) has no runs to keep and takes the Variable as it is.
"""

from __future__ import annotations

import logging
import sys

PIN_VARIABLE = "tpuflow_backend_pinned.{dag_id}"
# TaskInstanceState values of a task that has not finished ("null": no state yet), as Airflow's State.unfinished.
UNFINISHED_STATES = (
    "null",
    "scheduled",
    "queued",
    "running",
    "restarting",
    "up_for_retry",
    "up_for_reschedule",
    "deferred",
    "awaiting_input",
)
_log = logging.getLogger(__name__)


def _in_airflow_process() -> bool:
    """Whether a supervisor answers this process's Variable and task-count requests (DAG processor, task runner)."""
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    return getattr(runner, "SUPERVISOR_COMMS", None) is not None


def _unfinished_tasks(dag_id: str) -> int | None:
    """How many of the DAG's task instances have not finished, in every run; None when it cannot be told."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    try:
        return RuntimeTaskInstance.get_ti_count(dag_id=dag_id, states=list(UNFINISHED_STATES))
    except Exception as err:  # noqa: BLE001 - the metadata DB unreachable: keep the shape the runs have
        _log.warning(
            "Could not count the unfinished tasks of %s (%s); its backend stays as its runs have it", dag_id, err
        )
        return None


def run_backend(dag_id: str, configured: str, backends: tuple[str, ...]) -> str:
    """The backend ``dag_id`` is built for: ``configured`` (the Variable), unless runs started on the recorded
    one are still in flight."""
    if not _in_airflow_process():
        return configured
    from airflow.sdk import Variable

    key = PIN_VARIABLE.format(dag_id=dag_id)
    pinned = Variable.get(key, default=None)
    if pinned == configured:
        return configured
    if pinned in backends:
        unfinished = _unfinished_tasks(dag_id)
        if unfinished is None or unfinished > 0:
            _log.warning(
                "%s keeps backend %s while %s of its tasks are unfinished: the Variable tpuflow_backend (%s) applies "
                "to its runs once they are done",
                dag_id,
                pinned,
                "some" if unfinished is None else unfinished,
                configured,
            )
            return str(pinned)
    try:
        Variable.set(key, configured, description=f"Set by tpuflow: the backend the runs of {dag_id} are started on")
    except Exception as err:  # noqa: BLE001 - e.g. a key past Airflow's 250 characters: the DAG still loads
        _log.warning("Could not record the backend of %s's runs in the Variable %s: %s", dag_id, key, err)
    return configured
