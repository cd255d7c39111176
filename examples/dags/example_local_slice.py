"""Airflow DAG (example): a simulated TPU slice on this machine (an embedded local Ray cluster), and a Ray job on it.

The how-to page docs/howto/local-slice.md includes the marked parts. Parsing it starts nothing.
"""

from datetime import datetime

from airflow.sdk import DAG

from tpuflow.local.operators import LocalRayCreateClusterOperator, LocalRayDeleteClusterOperator
from tpuflow.rayjob.operators import RaySubmitJobOperator

with DAG("example_local_slice", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    # [START howto_local_create_cluster]
    start = LocalRayCreateClusterOperator(
        task_id="start_cluster",
        tpu_slice={"accelerator": "v6e", "topology": "2x4", "machine_type": "ct6e-standard-4t"},  # 2 hosts
        start_timeout=300,
    )
    # [END howto_local_create_cluster]
    job = RaySubmitJobOperator(
        task_id="hosts",
        cluster=start.output,
        entrypoint=["python", "-c", "import ray; ray.init(); print(ray.cluster_resources())"],
    )
    # [START howto_local_delete_cluster]
    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output)
    start >> job >> stop.as_teardown(setups=start)
    # [END howto_local_delete_cluster]
