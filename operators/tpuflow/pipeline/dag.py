"""One DAG file, either backend: ``tpu_pipeline(dag_id, workload=...)``.

A team writes its DAG once; where it runs is configuration, read when the file is parsed:

- the Airflow Variable ``tpuflow_backend`` (``local``, the default, or ``gke``), as any Variable is given
  (``AIRFLOW_VAR_TPUFLOW_BACKEND``, a secrets backend, the metadata DB); ``backend=`` pins it in the file;
- on ``gke``, where the cluster is: the Variables of ``tpuflow.pipeline.gke.variable_settings`` (read when a
  task runs), and the connections they name. ``tpuflow standins up`` prints the lines that point all of it at
  the stand-ins.

The backend decides the DAG's shape (a local cluster's start / stop tasks, or node pools, RayClusters and a
RayService), so it is read at parse time, not from a run's Param: the Airflow of a laptop and of a team's
Composer environment parse the same file into the pipeline each can run. A value that is neither backend is a
DAG import error naming the Variable. A changed Variable applies to a DAG once its runs in flight are done: none is
re-shaped mid-way (``tpuflow.pipeline.backend_pin``).

Mistakes in the file are DAG import errors of one line too, before any run can bill: a step of the workload whose
module or function is not in its ``code_dir`` (``Workload.check_code``, nothing imported), and a slice given as a
DAG argument (``accelerator=``, ``topology=``: the slice is each run's Params).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from tpuflow.errors import UserInputError
from tpuflow.pipeline.backend_pin import run_backend
from tpuflow.pipeline.factory import build_pipeline_dag, refuse_slice_arguments
from tpuflow.pipeline.params import FRAMEWORKS, START_DATE
from tpuflow.pipeline.workload import Workload

BACKEND_VARIABLE = "tpuflow_backend"
BACKENDS = ("local", "gke")


def configured_backend() -> str:
    """The Variable ``tpuflow_backend`` (its environment form first: no round trip when it is set there),
    else ``local``."""
    raw = os.environ.get(f"AIRFLOW_VAR_{BACKEND_VARIABLE.upper()}")
    if raw is None:
        from airflow.sdk import Variable

        raw = Variable.get(BACKEND_VARIABLE, default=None)
    return checked_backend(raw if raw is not None else "local", source=f"Variable {BACKEND_VARIABLE}")


def checked_backend(value: Any, *, source: str = "backend") -> str:
    backend = value.strip().lower() if isinstance(value, str) else value
    if backend not in BACKENDS:
        raise UserInputError(source, value, f"set it to {' or '.join(BACKENDS)}")
    return backend


def tpu_pipeline(
    dag_id: str,
    *,
    workload: Workload,
    backend: str | None = None,
    schedule: str | None = "@daily",
    start_date: datetime = START_DATE,
    output_root: str | None = None,
    serve_token_conn_id: str | None = None,
    gke: Mapping[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """The train-and-serve pipeline of ``workload`` on the configured backend.

    :param backend: ``local`` or ``gke``; None: the Variable ``tpuflow_backend`` (default ``local``).
    :param output_root: where runs write (RUN = ROOT/dag_id/date); None: ``tpuflow.paths.output_root()``
        locally, the Variable ``tpuflow_gke_output_root`` on GKE (a gs:// bucket the TPU hosts reach).
    :param serve_token_conn_id: a Connection whose password is the endpoint's bearer token.
    :param gke: arguments of ``tpuflow.pipeline.gke.build_gke_pipeline_dag`` that override the Variables
        (e.g. ``{"serve_code_uri": "gs://acme/code.zip", "capacity": "spot"}``); ignored locally.
    :param dag_kwargs: the rest of ``airflow.sdk.DAG``'s arguments (tags, doc_md, max_active_runs, ...).
    """
    if not isinstance(workload, Workload):
        raise UserInputError("workload", workload, "give a tpuflow.pipeline.workload.Workload")
    refuse_slice_arguments(dag_kwargs)
    if workload.code_dir is not None:  # without one the steps are in the image: check_params looks then
        workload.check_code(FRAMEWORKS)
    # A changed Variable re-shapes no run in flight: it applies once they are done (tpuflow.pipeline.backend_pin).
    chosen = checked_backend(backend) if backend is not None else run_backend(dag_id, configured_backend(), BACKENDS)
    common = {"workload": workload, "schedule": schedule, "start_date": start_date, **dag_kwargs}
    if chosen == "local":
        return build_pipeline_dag(dag_id, output_root=output_root, serve_token_conn_id=serve_token_conn_id, **common)
    from tpuflow.pipeline.gke import build_gke_pipeline_dag, variable_settings

    settings = variable_settings()
    if output_root is not None:
        settings["output_root"] = output_root
    settings.update(_gke_overrides(gke, taken=common))
    return build_gke_pipeline_dag(dag_id, serve_token_conn_id=serve_token_conn_id, **settings, **common)


def _gke_overrides(gke: Mapping[str, Any] | None, *, taken: Mapping[str, Any]) -> dict[str, Any]:
    """``gke`` checked against build_gke_pipeline_dag's own arguments (one line for an unknown one)."""

    from tpuflow.pipeline.gke import build_gke_pipeline_dag

    if gke is None:
        return {}
    if not isinstance(gke, Mapping):
        raise UserInputError("gke", gke, "give a dict of build_gke_pipeline_dag arguments, e.g. {'capacity': 'spot'}")
    known = set(inspect.signature(build_gke_pipeline_dag).parameters) - {"dag_id", "dag_kwargs", *taken}
    for key in gke:
        if key not in known:
            raise UserInputError(f"gke[{key!r}]", gke[key], f"use one of {', '.join(sorted(known))}")
    return dict(gke)
