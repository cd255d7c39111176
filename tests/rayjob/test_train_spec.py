"""RayTrainOperator derives the training spec from the slice, per backend."""

import pytest

from tpuflow.errors import UserInputError
from tpuflow.rayjob.workload_operators import RayTrainOperator


def op(framework="jax", backend="local", topology="4x4", machine_type=None, **kw):
    return RayTrainOperator(
        task_id="train",
        framework=framework,
        train_loop=f"addition.train_{framework}:train_loop_per_worker",
        tpu_slice={"accelerator": "TPU-V6E", "topology": topology, "machine_type": machine_type},
        storage_path="/tmp/s",
        run_name=kw.pop("run_name", "r"),
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


def test_torch_on_a_simulated_slice_keeps_rays_tpu_path_one_gloo_worker_per_device():
    """No rewrite to use_tpu=False: the simulated hosts run Ray's TPU path with the torch_tpu stand-in."""
    spec = op("torch").build_spec()
    assert spec["torch_backend"] == "gloo"
    assert spec["scaling_config"] == {
        "use_tpu": True,
        "topology": "4x4",
        "accelerator_type": "TPU-V6E",
        "num_workers": 16,
        "resources_per_worker": {"TPU": 1},
    }


def test_torch_on_a_simulated_2x4_of_two_hosts_is_pinned_to_one_slice_per_device():
    spec = op("torch", topology="2x4", machine_type="ct6e-standard-4t").build_spec()
    assert spec["scaling_config"]["use_tpu"] is True and spec["scaling_config"]["num_workers"] == 8
    assert spec["scaling_config"]["resources_per_worker"] == {"TPU": 1, "c1-slice-0": 0.25}


def test_the_driver_gets_the_run_name_and_the_resume_policy_as_given():
    """The driver picks the run (the latest of "r" under storage_path, or a new one): tests/workloads."""
    assert {k: op().build_spec()[k] for k in ("run_name", "resume")} == {"run_name": "r", "resume": "auto"}
    assert {k: op(resume="never").build_spec()[k] for k in ("run_name", "resume")} == {
        "run_name": "r",
        "resume": "never",
    }


def test_ray_train_configs_reach_the_spec_unchanged():
    spec = op(max_failures=5, checkpoint_num_to_keep=None, checkpoint_score_attribute="loss",
              checkpoint_score_order="min").build_spec()  # fmt: skip
    assert (spec["max_failures"], spec["checkpoint_num_to_keep"]) == (5, None)
    assert (spec["checkpoint_score_attribute"], spec["checkpoint_score_order"]) == ("loss", "min")
    assert "checkpoint_score_attribute" not in op().build_spec()  # unset: Ray's defaults
    assert op("torch", backend="kuberay", torch_backend="gloo").build_spec()["torch_backend"] == "gloo"
    assert op("torch", torch_backend="tpu_dist").build_spec()["torch_backend"] == "tpu_dist"
    assert op("torch", backend="kuberay").build_spec()["torch_backend"] == "tpu_dist"  # unset: the slice's


@pytest.mark.parametrize(
    ("kw", "field", "fix"),
    [
        (
            {"checkpoint_score_order": "best", "checkpoint_score_attribute": "loss"},
            "checkpoint_score_order",
            "max, min",
        ),
        ({"checkpoint_score_order": "min"}, "checkpoint_score_order", "set checkpoint_score_attribute"),
        ({"checkpoint_score_attribute": " "}, "checkpoint_score_attribute", "metric"),
        ({"torch_backend": "nccl", "framework": "torch"}, "torch_backend", "gloo, tpu_dist"),
        ({"torch_backend": "gloo"}, "torch_backend", "framework torch"),
        ({"max_failures": -2}, "max_failures", "-1"),
        ({"checkpoint_num_to_keep": 0}, "checkpoint_num_to_keep", ""),
        ({"resume": "always"}, "resume", "auto, never"),
        ({"run_name": "r-fresh2"}, "run_name", "-fresh<N>"),
        ({"run_name": "a/b"}, "run_name", 'without "/"'),
    ],
)
def test_bad_ray_train_configs_are_refused_when_parsed(kw, field, fix):
    framework = kw.pop("framework", "jax")
    with pytest.raises(UserInputError) as err:
        op(framework, **kw)
    assert err.value.field == field and fix in err.value.fix
    assert "\n" not in str(err.value)


def test_a_reused_finished_checkpoint_is_said_in_the_task_log(capsys):
    result = {"checkpoint": "/s/r/checkpoint_9", "resumed_from": "/s/r/checkpoint_9", "reused_finished": True}
    assert op()._check_result(result) is result
    assert capsys.readouterr().out.count("reusing the finished checkpoint /s/r/checkpoint_9 of an earlier run of this date: "
                             "0 steps trained; set Param resume=never to train again") == 1  # fmt: skip
    op()._check_result({**result, "reused_finished": False})
    assert "reusing" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"framework": "tf"}, "framework"),
        ({"resume": "maybe"}, "resume"),
        ({"tpu_slice": {"accelerator": "v6e", "topology": "16"}}, "tpu_slice.topology"),
    ],
)
def test_bad_arguments_name_the_field(kw, field):
    operator = op()
    for key, value in kw.items():
        setattr(operator, key, value)
    with pytest.raises(UserInputError) as err:
        operator.validate_arguments()
    assert err.value.field == field


def _train(**kw):
    args = {"framework": "jax", "train_loop": "m:f", "storage_path": "/tmp/s", "run_name": "r",
            "cluster": {"backend": "kuberay", "name": "c1", "dashboard_url": "http://x"}}  # fmt: skip
    return RayTrainOperator(task_id="train", **{**args, **kw})


def test_a_templated_slice_is_checked_once_rendered_and_trains_on_what_it_names():
    from tpuflow.tpu import TpuSlice

    templated = {"accelerator": "{{ params.accelerator }}", "topology": "{{ params.topology }}"}
    operator = _train(tpu_slice=templated)  # not checked while a template
    operator.render_template_fields({"params": {"accelerator": "v5litepod", "topology": "4x4"}})
    assert operator.tpu_slice == {"accelerator": "v5litepod", "topology": "4x4"}
    operator.validate_arguments()
    assert operator.build_spec()["scaling_config"] == TpuSlice.from_spec("v5e", "4x4").scaling_config()
    operator.tpu_slice = {"accelerator": "TPU-V6E", "topology": "16"}  # a template that rendered a chip count
    with pytest.raises(UserInputError) as err:
        operator.validate_arguments()
    assert err.value.field == "tpu_slice.topology" and "\n" not in str(err.value)


def test_a_tpu_slice_object_is_static_and_trains_as_its_mapping_does():
    from tpuflow.tpu import TpuSlice

    tpu = TpuSlice.from_spec("v6e", "2x4", "ct6e-standard-4t")
    operator = _train(tpu_slice=tpu)
    operator.render_template_fields({"params": {}})
    assert operator.tpu_slice is tpu
    as_mapping = _train(tpu_slice={"accelerator": "v6e", "topology": "2x4", "machine_type": "ct6e-standard-4t"})
    assert operator.build_spec() == as_mapping.build_spec() == _train(tpu_slice=tpu.to_dict()).build_spec()
    with pytest.raises(UserInputError) as err:  # a shape Ray cannot place: refused when parsed, naming the field
        _train(tpu_slice=TpuSlice.from_spec("v4", "4x16x16"))
    assert err.value.field == "tpu_slice.topology" and "Ray 2.60 does not accept" in str(err.value)


def test_the_old_slice_arguments_are_refused():
    with pytest.raises(TypeError, match="tpu_slice"):
        _train(accelerator="TPU-V6E", topology="4x4")
    with pytest.raises(TypeError, match="machine_type"):
        _train(tpu_slice={"accelerator": "v6e", "topology": "4x4"}, machine_type="ct6e-standard-4t")
