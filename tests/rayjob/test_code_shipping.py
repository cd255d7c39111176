"""A team's own code travels with the job as Ray ships it; what Ray could not ship fails before submitting.

The user's package (acme_forecast, unlike the demo's) lives in a temporary folder. A job whose
working_dir is that folder keeps tpuflow's driver importable: the runtime_env the operator submits is
packed and unpacked with Ray's own packaging functions and imported from there, as the job's
driver would. A single-file py_modules entry, a missing path, a folder that is not a package, a
package over the dashboard's upload limit or a copy of the driver in the user's folder fails at the
start of execute, before the cluster is asked anything, as a UserInputFailure: an
AirflowFailException, which Airflow's task runner fails without using the task's retries.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from support.workload_operators import train_operator

from tpuflow import workloads_dir
from tpuflow.errors import UserInputError
from tpuflow.rayjob.failures import UserInputFailure
from tpuflow.rayjob.operators import RaySubmitJobOperator
from tpuflow.rayjob.workload_operators import RayDataPrepOperator, RayTrainOperator

CLUSTER = {"dashboard_url": "http://ray.test:8265", "backend": "kuberay"}


class RecordingJobs:
    """A dashboard with no jobs that records each submission."""

    dashboard_url = CLUSTER["dashboard_url"]

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []

    def find_jobs(self, prefix: str) -> list[Any]:
        return []

    def submit_job(self, **kwargs: Any) -> str:
        self.submitted.append(kwargs)
        return kwargs["submission_id"]


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """A team's code folder: the package acme_forecast (a train loop and a prep module) and a helper script."""
    root = tmp_path / "forecasting"
    package = root / "acme_forecast"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("def fit_loop(config):\n    return config\n")
    (package / "prep.py").write_text("print('prep')\n")
    (root / "acme_helpers.py").write_text("SCALE = 3\n")
    return root


def _train(**kwargs: Any) -> RayTrainOperator:
    return train_operator(
        train_loop="acme_forecast.model:fit_loop",
        storage_path="/tmp/acme-runs",
        run_name="forecast",
        cluster=CLUSTER,
        **kwargs,
    )


def _job(**kwargs: Any) -> RaySubmitJobOperator:
    return RaySubmitJobOperator(
        task_id="job", entrypoint=["python", "-m", "acme_forecast.prep"], cluster=CLUSTER, **kwargs
    )


def _submitted_runtime_env(op: RaySubmitJobOperator, context: dict[str, Any]) -> dict[str, Any]:
    """What the operator hands Ray's JobSubmissionClient (it defers right after submitting)."""
    jobs = RecordingJobs()
    op.hook = lambda: jobs  # type: ignore[method-assign]
    with pytest.raises(TaskDeferred):
        op.execute(context)
    [submission] = jobs.submitted
    return submission["runtime_env"]


def _unpack_as_ray_does(runtime_env: dict[str, Any], into: Path) -> tuple[Path, list[Path]]:
    """The job's working directory and py_modules folders on a node: each local package zipped with
    Ray's create_package (a py_modules folder under its own name) and unzipped."""
    from ray._private.ray_constants import get_runtime_env_default_excludes
    from ray._private.runtime_env.packaging import create_package

    def unpack(path: str, name: str, *, parent: bool, excludes: list[str]) -> Path:
        archive, target = into / f"{name}.zip", into / name
        create_package(path, archive, include_gitignore=True, include_parent_dir=parent, excludes=excludes)
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(target)
        return target

    into.mkdir()
    excludes = list(runtime_env.get("excludes") or [])
    working = unpack(runtime_env["working_dir"], "wd", parent=False, excludes=get_runtime_env_default_excludes())
    modules = [
        unpack(m, f"m{i}", parent=True, excludes=excludes) for i, m in enumerate(runtime_env.get("py_modules", []))
    ]
    return working, modules


def _imports_on_the_node(runtime_env: dict[str, Any], into: Path, statement: str) -> str:
    """Run ``statement`` where Ray runs the job's driver: in the unpacked working_dir, with the
    py_modules folders first on PYTHONPATH (Ray's set_pythonpath_in_context); -S: nothing from this
    machine's site-packages."""
    working, modules = _unpack_as_ray_does(runtime_env, into)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(m) for m in modules)}
    done = subprocess.run(
        [sys.executable, "-S", "-c", statement], cwd=working, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


IMPORTS = (
    "import importlib.util, acme_forecast.model, acme_helpers, tpuflow_driver; "
    "assert importlib.util.find_spec('tpuflow_driver.train') is not None; "
    "print(acme_forecast.model.__file__); print(tpuflow_driver.__file__)"
)


def test_the_users_working_dir_travels_with_the_driver_beside_it(code, tmp_path, fresh_context):
    env = _submitted_runtime_env(_train(working_dir=str(code)), fresh_context("train"))
    assert env["working_dir"] == str(code)  # the user's folder is the job's current directory
    assert env["py_modules"] == [str(Path(workloads_dir()) / "tpuflow_driver")]
    user_file, driver_file = _imports_on_the_node(env, tmp_path / "node", IMPORTS).split()
    assert Path(user_file).is_relative_to(tmp_path / "node" / "wd")
    assert Path(driver_file).is_relative_to(tmp_path / "node" / "m0")


def test_the_users_package_as_py_modules_keeps_its_own_entries_first(code, tmp_path, fresh_context):
    op = RayDataPrepOperator(
        task_id="prep",
        module="acme_forecast.prep",
        cluster=CLUSTER,
        working_dir=str(tmp_path),
        runtime_env={"py_modules": [str(code / "acme_forecast")], "env_vars": {"SCALE": "3"}},
    )
    env = _submitted_runtime_env(op, fresh_context("prep"))
    assert env["py_modules"] == [str(code / "acme_forecast"), str(Path(workloads_dir()) / "tpuflow_driver")]
    assert env["env_vars"]["SCALE"] == "3"
    statement = "import acme_forecast.prep, tpuflow_driver.result"
    _imports_on_the_node(env, tmp_path / "node", statement)


def test_the_default_working_dir_already_holds_the_driver(code):
    assert "py_modules" not in _train().build_runtime_env()
    user = _train(runtime_env={"py_modules": [str(code / "acme_forecast")]}).build_runtime_env()
    assert user["py_modules"] == [str(code / "acme_forecast")]


def _fails_before_submitting(op: RaySubmitJobOperator, context: dict[str, Any]) -> UserInputFailure:
    op.hook = lambda: pytest.fail("nothing may be submitted for code Ray cannot ship")  # type: ignore[method-assign]
    with pytest.raises(UserInputError) as err:
        op.execute(context)
    # AirflowFailException: the task fails without using its retries (a retry would fail the same way).
    assert isinstance(err.value, UserInputFailure) and isinstance(err.value, AirflowFailException)
    # One line, and no chained traceback of Ray's own error behind it.
    assert "\n" not in str(err.value) and (err.value.__context__ is None or err.value.__suppress_context__)
    return err.value


def test_a_single_file_py_module_is_a_user_error_without_retry(code, fresh_context):
    helper = str(code / "acme_helpers.py")
    err = _fails_before_submitting(_job(runtime_env={"py_modules": [helper]}), fresh_context())
    assert err.field == "runtime_env['py_modules'][0]" and err.value == helper
    assert "acme_helpers/__init__.py" in err.fix and "working_dir" in err.fix
    archive = code / "acme_forecast.zip"  # Ray takes a local archive as working_dir, as py_modules only a .whl
    archive.write_bytes(b"PK\x05\x06" + bytes(18))
    err = _fails_before_submitting(_job(runtime_env={"py_modules": [str(archive)]}), fresh_context())
    assert err.field == "runtime_env['py_modules'][0]" and ".whl" in err.fix


@pytest.mark.parametrize("field", ["working_dir", "runtime_env['working_dir']", "py_modules"])
def test_a_missing_path_is_a_user_error_without_retry(field, tmp_path, fresh_context):
    missing = str(tmp_path / "acme_forecast_v2")
    kwargs: dict[str, Any] = {
        "working_dir": {"working_dir": missing},
        "runtime_env['working_dir']": {"runtime_env": {"working_dir": missing}},
        "py_modules": {"runtime_env": {"py_modules": [missing]}},
    }[field]
    err = _fails_before_submitting(_train(**kwargs), fresh_context("train"))
    assert err.field == (f"runtime_env['{field}'][0]" if field == "py_modules" else field)
    assert err.value == missing and "no such" in err.fix


def test_a_folder_that_is_not_a_package_names_the_package_inside(code, fresh_context):
    err = _fails_before_submitting(_job(runtime_env={"py_modules": [str(code)]}), fresh_context())
    assert "no __init__.py" in err.fix and str(code / "acme_forecast") in err.fix
    dashed = code.parent / "acme-forecast"
    (dashed / "__init__.py").parent.mkdir()
    (dashed / "__init__.py").write_text("")
    err = _fails_before_submitting(_job(runtime_env={"py_modules": [str(dashed)]}), fresh_context())
    assert "not a module name" in err.fix and "acme_forecast" in err.fix


def test_a_package_over_the_upload_limit_is_a_user_error_and_ray_excludes_count(code, fresh_context):
    from tpuflow.rayjob.code_shipping import max_package_bytes

    weights = code / "weights.bin"
    with weights.open("wb") as sparse:  # no disk used: a hole of the limit's size
        sparse.truncate(max_package_bytes() + 1)
    err = _fails_before_submitting(_job(working_dir=str(code)), fresh_context())
    assert err.field == "working_dir" and "100.0 MiB" in err.fix and "excludes" in err.fix
    # Left out the way Ray leaves files out, it ships.
    _job(working_dir=str(code), runtime_env={"excludes": ["weights.bin"]}).validate_arguments()
    (code / ".gitignore").write_text("*.bin\n")
    _job(working_dir=str(code)).validate_arguments()


def test_a_copy_of_the_driver_in_the_users_code_would_shadow_it(code, fresh_context):
    (code / "tpuflow_driver").mkdir()
    err = _fails_before_submitting(_train(working_dir=str(code)), fresh_context("train"))
    assert err.field == "working_dir" and "shadow" in err.fix


@pytest.mark.parametrize(
    ("runtime_env", "field"),
    [
        ({"working_dir": "gs://acme-code/forecasting.txt"}, "runtime_env['working_dir']"),
        ({"py_modules": ["gs://acme-code/acme_forecast.txt"]}, "runtime_env['py_modules'][0]"),
        ({"py_modules": "acme_forecast"}, "runtime_env['py_modules']"),
    ],
)
def test_rays_own_rules_for_uris_and_types(runtime_env, field, fresh_context):
    err = _fails_before_submitting(_job(runtime_env=runtime_env), fresh_context())
    assert err.field == field


def test_remote_code_is_left_to_ray(fresh_context):
    env = {"working_dir": "gs://acme-code/forecasting.zip", "py_modules": ["gs://acme-code/acme_forecast-1.0.whl"]}
    op = _job(runtime_env=env)
    op.validate_arguments()
    assert op.build_runtime_env()["py_modules"][0] == "gs://acme-code/acme_forecast-1.0.whl"


@pytest.mark.slow
def test_on_a_ray_cluster_the_users_job_reports_through_the_driver(slice_cluster, code, fresh_context):
    """Through Ray's own job submission: the user's folder is the working_dir and its job hands its
    result over with tpuflow_driver.result, which travelled beside it."""
    (code / "acme_forecast" / "report.py").write_text(
        "import acme_helpers\nfrom tpuflow_driver.result import emit_result\n\n"
        "emit_result({'scale': acme_helpers.SCALE})\n"
    )
    op = RaySubmitJobOperator(
        task_id="job",
        entrypoint=["python", "-m", "acme_forecast.report"],
        cluster=slice_cluster.connection_info(),
        working_dir=str(code),
        deferrable=False,
        poll_interval=0.5,
    )
    assert op.execute(fresh_context()) == {"scale": 3}
