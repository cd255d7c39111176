"""Airflow DAG: train a small LM on a (simulated) TPU slice with Ray, evaluate it, serve it, tear down.

The embedded default: a local Ray cluster with simulated TPU hosts stands in for GKE.
Heavy imports (ray, jax, google clients) happen inside tasks, never at parse time.
"""

from tpuflow.pipeline.factory import build_pipeline_dag
from tpuflow.workloads.addition.pipeline import ADDITION

dag = build_pipeline_dag("tpu_llm_pipeline_local", workload=ADDITION)
