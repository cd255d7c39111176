"""Airflow DAG (example): a Ray Serve application on the slice's Ray cluster, a smoke test of its endpoint, and a
kept endpoint that stops once idle.

The how-to page docs/howto/ray-serve.md includes the marked parts. Parsing it starts nothing.
"""

from datetime import datetime

from airflow.sdk import DAG

from tpuflow.local.operators import LocalRayCreateClusterOperator, LocalRayDeleteClusterOperator
from tpuflow.serve.idle_stop import RayServeWaitForIdleOperator
from tpuflow.serve.operators import RayServeDeployOperator, ServeEndpointSmokeTestOperator
from tpuflow.tpu import TpuSlice

SLICE = TpuSlice.from_spec("v6e", "2x4", machine_type="ct6e-standard-4t")

with DAG("example_ray_serve", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    start = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=SLICE)

    # [START howto_ray_serve_deploy]
    deploy = RayServeDeployOperator(
        task_id="deploy",
        cluster=start.output,
        tpu_slice=SLICE,  # a multi-host app gets accelerator_type and accelerator_config.topology from the slice
        serve_config={
            "applications": [
                {
                    "name": "chat",
                    "route_prefix": "/chat",
                    "import_path": "acme_models.chat:build_app",
                    "runtime_env": {"working_dir": "/opt/acme"},
                    "args": {"checkpoint": "/tmp/acme/train/checkpoint"},
                }
            ]
        },
        deploy_timeout=900,  # still DEPLOYING then: fails naming what is stuck and why
        on_kill_action="delete",
        serve_token_conn_id="acme_serve_token",  # the apps get only the token's SHA-256
    )
    # [END howto_ray_serve_deploy]

    # [START howto_ray_serve_smoke_test]
    smoke = ServeEndpointSmokeTestOperator(
        task_id="smoke_test",
        url="{{ ti.xcom_pull(task_ids='deploy')['serve_url'] }}/chat/v1/completions",
        payload={"model": "chat", "prompt": "12+34=", "max_tokens": 4},
        expect="46",
        timeout=120,
        serve_token_conn_id="acme_serve_token",
    )
    # [END howto_ray_serve_smoke_test]

    # [START howto_ray_serve_wait_for_idle]
    watch = RayServeWaitForIdleOperator(
        task_id="serve_until_idle",
        cluster=start.output,  # its metrics_url: Serve's own request counters
        keep="{{ params.keep_endpoint }}",
        idle_timeout_minutes=30,  # no successful answer for 30 min: the teardowns delete the endpoint
        max_lifetime_hours=12,  # however busy (at most the Variable tpuflow_max_kept_endpoint_hours)
    )
    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output)
    start >> deploy >> smoke >> watch >> stop.as_teardown(setups=start)
    # [END howto_ray_serve_wait_for_idle]
