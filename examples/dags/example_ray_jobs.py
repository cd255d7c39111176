"""Airflow DAG (example): Ray jobs on a TPU slice: data prep with Ray Data, the slice preflight, training with
Ray Train, and any job of your own. The slice here is the simulated local one; on GKE ``cluster`` is the
KubeRay create task's XCom instead (docs/howto/kuberay.md), and nothing else changes.

The how-to page docs/howto/ray-jobs.md includes the marked parts. Parsing it starts nothing.
"""

from datetime import datetime

from airflow.sdk import DAG

from tpuflow.local.operators import LocalRayCreateClusterOperator, LocalRayDeleteClusterOperator
from tpuflow.rayjob.operators import RaySubmitJobOperator
from tpuflow.rayjob.preflight import RaySlicePreflightOperator
from tpuflow.rayjob.workload_operators import RayDataPrepOperator, RayTrainOperator
from tpuflow.tpu import TpuSlice

SLICE = TpuSlice.from_spec("v6e", "2x2")
RUN = "/tmp/acme/{{ ds }}"  # a gs://BUCKET/PREFIX on GKE, where the TPU hosts and Airflow both reach it

with DAG("example_ray_jobs", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    start = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=SLICE)

    # [START howto_ray_data_prep]
    prep = RayDataPrepOperator(
        task_id="prep",
        cluster=start.output,
        module="acme_forecast.prep",  # python -m acme_forecast.prep --output-dir ... --num-rows ...
        arguments={"output_dir": f"{RUN}/data", "num_rows": 20000},
        working_dir="/opt/acme",  # or py_modules in runtime_env: shipped with the job
        replace_output_dir=True,  # a rerun replaces the rows an earlier attempt wrote
    )
    # [END howto_ray_data_prep]

    # [START howto_ray_slice_preflight]
    preflight = RaySlicePreflightOperator(
        task_id="preflight", cluster=start.output, tpu_slice=SLICE, deadline_s=60, collective="jax"
    )
    # [END howto_ray_slice_preflight]

    # [START howto_ray_train]
    train = RayTrainOperator(
        task_id="train",
        cluster=start.output,
        framework="jax",  # JaxTrainer; "torch": TorchTrainer, one worker per chip
        train_loop="acme_forecast.fit:train_loop",
        tpu_slice=SLICE,  # ScalingConfig(use_tpu=True, topology=..., accelerator_type=...) from the slice
        storage_path=f"{RUN}/train",  # checkpoints: a retry or a rerun resumes from the latest
        run_name="forecast",
        datasets={"train": f"{RUN}/data/train"},
        train_loop_config={"num_steps": 1000, "checkpoint_every": 100},
        max_failures=2,
        min_result={"loss": -1.0},  # quality gate on the reported metrics (fails without retry)
        working_dir="/opt/acme",
    )
    # [END howto_ray_train]

    # [START howto_ray_submit_job]
    score = RaySubmitJobOperator(
        task_id="score",
        cluster=start.output,
        entrypoint=["python", "-m", "acme_forecast.score", "--run", RUN],  # an argument list, never a shell line
        working_dir="/opt/acme",
        env_vars={"HF_TOKEN": "{{ conn.hf.password }}"},  # runtime_env, never the command line; masked in logs
        job_timeout=3600,
        unreachable_timeout=300,  # a head that moved (node replaced): the retry finds it where it is now
        retries=2,
    )
    # [END howto_ray_submit_job]

    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output)
    start >> [prep, preflight] >> train >> score >> stop.as_teardown(setups=start)
