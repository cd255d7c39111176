"""Airflow DAG: train a small LM on a GKE TPU slice with KubeRay, evaluate it, serve it as a RayService, tear down.

Node pool -> RayCluster -> prep -> train -> evaluate -> RayService -> smoke test -> teardown of cluster and
pool (and of the endpoint unless keep_endpoint). Connections, project, cluster and image come from Airflow
Variables at run time (tpuflow.pipeline.gke.variable_settings), so pointing the DAG at another cluster,
or at the GKE and Kubernetes stand-ins, is configuration. The backend is pinned here so that this DAG and
tpu_llm_pipeline_local can sit side by side; a team's own DAG follows the Variable tpuflow_backend.
Heavy imports happen inside tasks, never at parse time.
"""

from dataclasses import replace

from tpuflow.workloads.addition.pipeline import ADDITION

from tpuflow.pipeline.dag import tpu_pipeline

# Evaluated by a job on the CPU cluster once the training slice is deleted, not by the training workers as
# in tpu_llm_pipeline_local: on a real slice the evaluation's compile and forward would keep every chip billed.
dag = tpu_pipeline("tpu_llm_pipeline_gke", workload=replace(ADDITION, evaluate_in_training=False), backend="gke")
