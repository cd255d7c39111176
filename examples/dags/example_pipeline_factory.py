"""Airflow DAG (example): a team's model as a whole pipeline from the factory, with a task of its own on the
training slice. Its modules are in the image here (no ``code_dir``), so parsing reads no code of the team's.

The how-to page docs/howto/pipeline-factory.md includes the marked parts. Parsing it starts nothing.
"""

# [START howto_pipeline_factory]
from airflow.sdk import Param

from tpuflow.pipeline.dag import tpu_pipeline
from tpuflow.pipeline.handles import on_training_slice, training_cluster
from tpuflow.pipeline.workload import Workload
from tpuflow.rayjob.operators import RaySubmitJobOperator

forecast = Workload(
    prep="acme_forecast.prep",  # optional: a Ray Data job writing RUN/data/train
    train_loop="acme_forecast.fit:train_loop",  # Ray Train's train_loop_per_worker
    params={"horizon": Param(7, type="integer", minimum=1, title="Forecast horizon (days)")},
    train_loop_config={"horizon": "{{ params.horizon }}"},
)
# backend: "local" or "gke"; left out, the Variable tpuflow_backend decides (a DAG file for both)
dag = tpu_pipeline("example_pipeline_factory", workload=forecast, schedule="@daily", backend="local")
# [END howto_pipeline_factory]

# [START howto_pipeline_own_task]
with dag:
    score = RaySubmitJobOperator(
        task_id="score", cluster=training_cluster(dag), entrypoint=["python", "-m", "acme_forecast.score"]
    )
    on_training_slice(dag, score)  # after the cluster is up, before its teardown
# [END howto_pipeline_own_task]
