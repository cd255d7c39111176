"""RaySlicePreflightOperator: the job it builds from the slice, turning it off, and one-line failures."""

from __future__ import annotations

import json
import shlex

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from support.airflow_context import task_context

from tpuflow.errors import UserInputError
from tpuflow.rayjob.operators import command_line
from tpuflow.rayjob.preflight import RaySlicePreflightOperator, failure_line
from tpuflow.rayjob.workload_operators import RayTrainOperator

CLUSTER = {"backend": "local", "name": "c1", "dashboard_url": "http://127.0.0.1:1"}


def op(tpu_slice=None, **kw):
    tpu_slice = {"accelerator": "TPU-V6E", "topology": "2x4", **(tpu_slice or {})}
    return RaySlicePreflightOperator(task_id="preflight", tpu_slice=tpu_slice, **{"cluster": CLUSTER, **kw})


def test_the_job_reserves_every_slice_the_training_uses():
    operator = op({"machine_type": "ct6e-standard-4t", "num_slices": 2}, deadline_s=12)
    entry = operator.build_entrypoint({})
    assert entry[:4] == ["python", "-m", "tpuflow_driver.preflight", "--spec-json"] and len(entry) == 5
    assert shlex.split(command_line(entry, "/opt/my env/bin/python"))[1:] == entry[1:]  # quoted as one argument
    spec = json.loads(entry[-1])
    assert spec == {
        "topology": "2x4",
        "accelerator_version": "v6e",
        "num_slices": 2,
        "chips_per_vm": 4,
        "deadline_s": 12.0,
        "collective": "jax",
    }
    assert operator.build_runtime_env()["env_vars"]["JAX_PLATFORMS"] == "cpu"
    assert "JAX_PLATFORMS" not in op(cluster={**CLUSTER, "backend": "kuberay"}).build_runtime_env().get("env_vars", {})


def test_turned_off_it_submits_nothing():
    operator = op(enabled="False")
    operator.hook = None  # type: ignore[assignment]  # a submission would call it
    assert operator.execute(task_context()) == {"skipped": True}


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"deadline_s": 0}, "deadline_s"), ({"collective": "mpi"}, "collective"),
     ({"tpu_slice": {"topology": "3x3"}}, "tpu_slice.topology"), ({"tpu_slice": {"num_slices": 0}}, "tpu_slice.num_slices")],
)  # fmt: skip
def test_bad_static_arguments_fail_at_parse_time(kw, field):
    with pytest.raises(UserInputError) as err:
        op(**kw)
    assert err.value.field == field


def test_a_failed_preflight_fails_at_once_with_its_own_line():
    tail = "[preflight] reserved ...\nTPUFLOW_PREFLIGHT_FAILED 1 of 4 host(s) did not answer the roll call within 20s: s-1/worker-0 (127.0.0.2)"
    event = {"status": "failed", "message": "ended FAILED", "retryable": True, "submission_id": "x",
             "job_status": "FAILED", "log_tail": tail}  # fmt: skip
    assert failure_line(event).startswith("1 of 4 host(s) did not answer")
    with pytest.raises(AirflowFailException, match=r"^slice preflight failed: 1 of 4 host"):
        op().execute_complete(task_context(), event)
    # a failure that is not the preflight's own (a lost head, say) keeps the job operator's handling
    with pytest.raises(AirflowException) as err:
        op().execute_complete(task_context(), {**event, "log_tail": "NodeDiedError"})
    assert not isinstance(err.value, AirflowFailException)


def _train(framework, backend, num_slices=2):
    return RayTrainOperator(
        task_id="train", framework=framework, train_loop=f"addition.train_{framework}:train_loop_per_worker",
        tpu_slice={"accelerator": "TPU-V6E", "topology": "2x4", "machine_type": "ct6e-standard-4t",
                   "num_slices": num_slices},
        storage_path="/tmp/s", run_name="r", cluster={**CLUSTER, "backend": backend},
    )  # fmt: skip


def test_jax_trains_across_slices_one_worker_per_host_of_every_slice():
    operator = _train("jax", "local")
    operator.validate_arguments()
    assert operator.build_spec()["scaling_config"]["num_workers"] == 4


def test_torch_across_simulated_slices_fails_at_check_time_with_the_reason():
    with pytest.raises(UserInputError, match="tpu_dist") as err:
        _train("torch", "local").validate_arguments()
    assert err.value.field == "tpu_slice.num_slices"
    _train("torch", "local", num_slices=1).validate_arguments()
    _train("torch", "kuberay").validate_arguments()  # TorchTPU (tpu_dist): Ray sets MEGASCALE_* for it


def test_a_templated_slice_is_checked_once_rendered_before_anything_is_submitted():
    templated = {"accelerator": "TPU-V6E", "topology": "{{ params.topology }}",
                 "machine_type": "ct6e-standard-4t", "num_slices": "{{ params.num_slices }}"}  # fmt: skip
    operator = RaySlicePreflightOperator(task_id="preflight", tpu_slice=templated, cluster=CLUSTER)
    operator.render_template_fields({"params": {"topology": "2x4", "num_slices": "2"}})
    spec = json.loads(operator.build_entrypoint({})[-1])
    assert (spec["topology"], spec["num_slices"], spec["chips_per_vm"]) == ("2x4", 2, 4)
    bad = RaySlicePreflightOperator(task_id="preflight", tpu_slice=templated, cluster=CLUSTER)
    bad.render_template_fields({"params": {"topology": "2x4", "num_slices": "0"}})
    bad.hook = None  # type: ignore[assignment]  # a submission would call it
    with pytest.raises(UserInputError) as err:
        bad.execute(task_context())
    assert err.value.field == "tpu_slice.num_slices" and "\n" not in str(err.value)


def test_the_old_slice_arguments_are_refused():
    with pytest.raises(TypeError, match="tpu_slice"):
        RaySlicePreflightOperator(task_id="preflight", accelerator="TPU-V6E", topology="2x4", cluster=CLUSTER)
    with pytest.raises(TypeError, match="num_slices"):
        op(num_slices=2)
