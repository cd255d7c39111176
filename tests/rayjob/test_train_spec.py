"""RayTrainOperator derives the training spec from the slice, per backend."""

import pytest
from tpuflow.errors import UserInputError
from tpuflow.rayjob.workload_operators import RayTrainOperator


def op(framework="jax", backend="local", topology="4x4", **kw):
    return RayTrainOperator(
        task_id="train",
        framework=framework,
        train_loop=f"addition.train_{framework}:train_loop_per_worker",
        accelerator="TPU-V6E",
        topology=topology,
        storage_path="/tmp/s",
        run_name="r",
        cluster={"backend": backend, "name": "c1", "dashboard_url": "http://x"},
        **kw,
    )


def test_jax_spec_uses_the_catalog_scaling_config():
    spec = op().build_spec()
    assert spec["scaling_config"] == {
        "use_tpu": True,
        "topology": "4x4",
        "accelerator_type": "TPU-V6E",
        "num_workers": 4,
    }
    assert spec["worker_env"]["JAX_PLATFORMS"] == "cpu"
    assert "JAX_PLATFORMS" not in op(backend="kuberay").build_spec()["worker_env"]


def test_jax_on_a_2x4_of_two_hosts_is_pinned_to_one_simulated_slice():
    """Ray reads v6e 2x4 as one 8-chip VM and reserves no slice by name; as two 4-chip hosts the workers could
    straddle two slices, so on simulated slices they are pinned to one (on GKE the spec is Ray's own)."""
    two_hosts = {"topology": "2x4", "machine_type": "ct6e-standard-4t"}
    spec = op(**two_hosts).build_spec()
    assert spec["scaling_config"]["resources_per_worker"] == {"TPU": 4, "c1-slice-0": 1}
    assert spec["scaling_config"]["num_workers"] == 2
    assert op(backend="kuberay", **two_hosts).build_spec()["scaling_config"]["resources_per_worker"] == {"TPU": 4}
    assert "resources_per_worker" not in op().build_spec()["scaling_config"]  # 4x4: Ray gang-reserves the slice


def test_torch_on_real_chips_is_one_worker_per_device_with_tpu_dist():
    spec = op("torch", backend="kuberay").build_spec()
    assert spec["torch_backend"] == "tpu_dist"
    assert spec["scaling_config"]["num_workers"] == 16 and spec["scaling_config"]["resources_per_worker"] == {"TPU": 1}


def test_torch_on_a_simulated_slice_is_one_gloo_worker_per_host_pinned_to_the_slice():
    spec = op("torch").build_spec()
    assert spec["torch_backend"] == "gloo"
    assert spec["scaling_config"] == {
        "use_tpu": False,
        "num_workers": 4,
        "resources_per_worker": {"CPU": 1, "c1-slice-0": 1},
    }


def test_resume_never_gives_each_try_its_own_run():
    assert op().build_spec(try_number=2)["run_name"] == "r"
    assert op(resume="never").build_spec(try_number=2)["run_name"] == "r-try2"


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"framework": "tf"}, "framework"), ({"resume": "maybe"}, "resume"), ({"topology": "16"}, "topology")],
)
def test_bad_arguments_name_the_field(kw, field):
    operator = op()
    for key, value in kw.items():
        setattr(operator, key, value)
    with pytest.raises(UserInputError) as err:
        operator.validate_arguments()
    assert err.value.field == field
