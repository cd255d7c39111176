"""The Ray workload operators as the tests build them: a RayTrainOperator that passes its checks (for tests
that vary one or two arguments), and the demo's prep and jax training run on a cluster."""

from __future__ import annotations

from typing import Any

from tpuflow.rayjob.workload_operators import RayDataPrepOperator, RayTrainOperator

# A jax train loop on one v6e 2x4 slice of a cluster that is never contacted.
TRAIN_ARGUMENTS: dict[str, Any] = {
    "task_id": "train",
    "framework": "jax",
    "train_loop": "m:f",
    "tpu_slice": {"accelerator": "TPU-V6E", "topology": "2x4"},
    "storage_path": "/tmp/s",
    "run_name": "r",
    "cluster": {"dashboard_url": "http://x"},
}
# Waited for in the worker, polled often: a test sees the job's end soon.
IN_THE_WORKER: dict[str, Any] = {"deferrable": False, "poll_interval": 0.5}


def train_operator(**arguments: Any) -> RayTrainOperator:
    """RayTrainOperator(TRAIN_ARGUMENTS, with ``arguments`` replacing or adding any of them)."""
    return RayTrainOperator(**{**TRAIN_ARGUMENTS, **arguments})


def addition_prep(cluster: dict[str, Any], output_dir: str, num_train: int) -> RayDataPrepOperator:
    """The demo's prep task: the 2026-11-02 addition problems, ``num_train`` of them for training."""
    return RayDataPrepOperator(
        task_id="prep",
        cluster=cluster,
        module="addition.prep",
        arguments={"output_dir": output_dir, "date": "2026-11-02", "num_train": num_train},
        **IN_THE_WORKER,
    )


def addition_train(
    cluster: dict[str, Any], tpu_slice: dict[str, Any], data: str, storage_path: str, run_name: str, **arguments: Any
) -> RayTrainOperator:
    """The demo's jax training on what ``addition_prep`` wrote to ``data``, keeping every checkpoint;
    ``arguments`` add to (or replace) the operator's (train_loop_config, log_uri, ...)."""
    return RayTrainOperator(
        task_id="train",
        cluster=cluster,
        framework="jax",
        train_loop="addition.train_jax:train_loop_per_worker",
        tpu_slice=tpu_slice,
        storage_path=storage_path,
        run_name=run_name,
        datasets={"train": f"{data}/train"},
        **{"checkpoint_num_to_keep": None, **IN_THE_WORKER, **arguments},
    )
