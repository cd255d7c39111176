"""Airflow DAG: train a small LM on a (simulated) TPU slice with Ray, evaluate it, serve it, tear down.

The embedded default: a local Ray cluster with simulated TPU hosts stands in for GKE. The backend is pinned
here so that this DAG and tpu_llm_pipeline_gke can sit side by side; a team's own DAG leaves `backend` out
and follows the Variable tpuflow_backend (tpuflow.pipeline.dag). Heavy imports (ray, jax, google clients)
happen inside tasks, never at parse time.
"""

from tpuflow.workloads.addition.pipeline import ADDITION

from tpuflow.pipeline.dag import tpu_pipeline

dag = tpu_pipeline("tpu_llm_pipeline_local", workload=ADDITION, backend="local")
