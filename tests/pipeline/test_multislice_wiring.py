"""num_slices and the slice preflight, wired through both pipelines (DAG structure and Params; no Ray)."""

from __future__ import annotations

import pytest
from tpuflow.workloads.addition.pipeline import ADDITION

from tpuflow.errors import UserInputError
from tpuflow.pipeline.factory import checked_slice
from tpuflow.pipeline.params import pipeline_params, validate_params

# every task reads the slice check_params validated, never the raw Param
NUM_SLICES = "{{ ti.xcom_pull(task_ids='check_params')['num_slices'] }}"


def defaults() -> dict:
    return {k: p.value for k, p in pipeline_params().items()}


def test_local_pipeline_preflights_the_slices_it_trains_on(tmp_path):
    from tpuflow.pipeline.factory import build_pipeline_dag

    dag = build_pipeline_dag("ms_local", workload=ADDITION, output_root=str(tmp_path))
    preflight = dag.get_task("preflight")
    # beside prep, on the training cluster, and training waits for it
    assert preflight.upstream_task_ids == {"start_cluster"} and "train" in preflight.downstream_task_ids
    assert "train" in dag.get_task("prep").downstream_task_ids
    assert preflight.enabled == "{{ params.preflight }}"
    for task_id in ("acquire_slice", "start_cluster", "preflight", "train"):
        # one slice argument, the same value for every task: the slice check_params validated
        assert dag.get_task(task_id).tpu_slice == checked_slice(), task_id
        assert "tpu_slice" in dag.get_task(task_id).template_fields, task_id
    assert checked_slice()["num_slices"] == NUM_SLICES
    for field, value in checked_slice().items():
        assert "xcom_pull(task_ids='check_params')" in value and "params." not in value, field


def test_gke_pipeline_gives_each_slice_its_pool_and_preflights_the_raycluster(tmp_path):
    from tpuflow.pipeline.gke import build_gke_pipeline_dag

    dag = build_gke_pipeline_dag(
        "ms_gke",
        workload=ADDITION,
        project_id="tpu-proj-123",
        location="us-east5-b",
        cluster_name="tpu-cluster",
        image="img",
        output_root=str(tmp_path),
    )
    # one pool per slice, replicas = slices, one worker group per slice: all from the same slice argument
    for task_id in ("create_node_pool", "request_capacity", "create_ray_cluster", "wait_for_flex_start", "train"):
        assert dag.get_task(task_id).tpu_slice == checked_slice(), task_id
    for task_id in ("create_serve_node_pool", "request_serve_capacity", "deploy"):
        assert dag.get_task(task_id).tpu_slice == checked_slice(serve=True), task_id
    preflight = dag.get_task("preflight")
    assert preflight.cluster.operator.task_id == "create_ray_cluster"
    assert "train" in preflight.downstream_task_ids


def test_both_pipelines_default_to_one_slice_with_the_preflight_on():
    from tpuflow.pipeline.gke import gke_pipeline_params

    for params in (pipeline_params(), gke_pipeline_params()):
        assert params["num_slices"].value == 1 and params["preflight"].value is True


def test_two_slices_double_the_hosts():
    checked = validate_params({**defaults(), "topology": "2x4", "machine_type": "ct6e-standard-4t", "num_slices": 2})
    assert (checked["num_slices"], checked["num_hosts"], checked["total_hosts"]) == (2, 2, 4)
    assert checked["scaling_config"]["num_workers"] == 4


def test_torch_across_simulated_slices_is_refused_by_check_params_with_the_reason():
    from tpuflow.pipeline.gke import check_gke_params

    params = {**defaults(), "framework": "torch", "topology": "2x4", "machine_type": "ct6e-standard-4t"}
    with pytest.raises(UserInputError, match="tpu_dist") as err:
        validate_params({**params, "num_slices": 2})
    assert err.value.field == "params.num_slices"
    assert check_gke_params({**params, "num_slices": 2})["num_slices"] == 2  # TorchTPU on chips: Ray supports it


@pytest.mark.parametrize("bad", [0, "two"])
def test_bad_num_slices_names_the_param(bad):
    with pytest.raises(UserInputError) as err:
        validate_params({**defaults(), "num_slices": bad})
    assert err.value.field == "params.num_slices"
