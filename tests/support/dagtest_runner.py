"""Run one DAG file with dag.test() (real task runner, triggers run inline) and print a JSON summary.

Used by tests/kuberay/test_dag_standin.py in a subprocess (run by its path) with its own AIRFLOW_HOME;
not a test module itself.
Usage: python dagtest_runner.py DAG_FILE DAG_ID
"""

from __future__ import annotations

import importlib.util
import json
import sys


def main(dag_file: str, dag_id: str) -> None:
    spec = importlib.util.spec_from_file_location("standin_dag", dag_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    dag.test()

    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).first()
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
        xcoms = {}
        for row in session.query(XComModel).filter(XComModel.dag_id == dag_id, XComModel.run_id == run.run_id):
            xcoms[f"{row.task_id}.{row.key}"] = XComModel.deserialize_value(row)
    print("DAGTEST_RESULT " + json.dumps({"run_id": run.run_id, "states": states, "xcoms": xcoms}, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
