"""No input reaches a shell unquoted. Ray's job manager runs every entrypoint with a shell, so each one is
built from an argument list and quoted with shlex.join once rendered (the interpreter path too): an output
root holding a space, a quote, `;`, backticks and `$(...)` reaches the job as the exact argument, and
nothing in it runs. `tpuflow local env` prints `export` lines a shell evaluates: quoted the same way.

Each command line is run here by /bin/sh -c, as Ray runs it, with the interpreter replaced by a script
that prints its arguments; tests/rayjob/test_entrypoint_quoting.py submits one to a real Ray cluster."""

from __future__ import annotations

import secrets
import shlex
import subprocess
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tpuflow.rayjob.operators import command_line

DATE = "2026-12-03"


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """A file that exists only if something in a path was run by the shell."""
    return tmp_path / f"pwned-{secrets.token_hex(4)}"


def hostile(marker: Path) -> str:
    return f'/tmp/out root/it\'s $(touch {marker}); touch {marker} `touch {marker}` "q" \\ end'


@pytest.fixture
def echo_python(tmp_path: Path) -> Path:
    """An "interpreter" in a folder whose path holds a space and a quote; it prints its arguments."""
    folder = tmp_path / "venv it's" / "bin"
    folder.mkdir(parents=True)
    script = folder / "python"
    script.write_text('#!/bin/sh\nfor a in "$@"; do printf \'%s\\0\' "$a"; done\n')
    script.chmod(0o755)
    return script


def run_as_ray_does(command: str) -> list[str]:
    """The arguments the program got when the shell ran ``command`` (Ray: Popen(entrypoint, shell=True))."""
    out = subprocess.run(command, shell=True, capture_output=True, check=True, timeout=30).stdout.decode()
    return out.split("\0")[:-1]


def test_an_argument_list_reaches_the_program_exactly(marker: Path, echo_python: Path) -> None:
    argv = ["python", "-m", "pkg.job", "--out", hostile(marker), "--n", 3, ""]
    command = command_line(argv, str(echo_python))
    assert shlex.split(command) == [str(echo_python), "-m", "pkg.job", "--out", hostile(marker), "--n", "3", ""]
    assert run_as_ray_does(command) == ["-m", "pkg.job", "--out", hostile(marker), "--n", "3", ""]
    assert not marker.exists()


def test_a_command_string_keeps_its_meaning_with_a_quoted_interpreter(echo_python: Path) -> None:
    """A user's own shell string is run as written; only the interpreter that replaces `python` is quoted."""
    command = command_line("python -m pkg.job --n 3", str(echo_python))
    assert run_as_ray_does(command) == ["-m", "pkg.job", "--n", "3"]
    assert command_line("echo hi", str(echo_python)) == "echo hi"


class TI:
    def __init__(self, checkpoint: str, tpu: dict[str, Any]) -> None:
        self.pulled = {"train": {"checkpoint": checkpoint}, "check_params": tpu}

    def xcom_pull(self, task_ids: str, **_: Any) -> Any:
        return self.pulled[task_ids]


def test_the_pipelines_evaluate_step_with_a_hostile_output_root(marker: Path, echo_python: Path) -> None:
    from dataclasses import replace

    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.factory import pipeline_dag, run_dir_for, training_steps
    from tpuflow.tpu import TpuSlice

    root = hostile(marker)
    job = replace(ADDITION, evaluate_in_training=False)  # the evaluate job, as tpu_llm_pipeline_gke runs it
    with pipeline_dag("quoting", schedule=None, start_date=datetime(2026, 11, 1), max_active_runs=1):
        run_dir = run_dir_for("quoting", root)
        _, _, evaluate = training_steps({"dashboard_url": "http://127.0.0.1:1"}, run_dir, workload=job)
    checkpoint = f"{root}/quoting/{DATE}/train/jax-tpu-v6e-4x4/checkpoint_000001"
    when = datetime(2026, 12, 3)
    context: Any = {
        "params": {"framework": "jax"},
        "ti": TI(checkpoint, TpuSlice.from_spec("TPU-V6E", "4x4").to_dict()),
        "dag_run": SimpleNamespace(logical_date=when, run_after=when),
    }
    evaluate.render_template_fields(context)
    command = command_line(evaluate.build_entrypoint(context), str(echo_python))
    expected = [
        *("-m", "addition.evaluate", "--framework", "jax", "--checkpoint", checkpoint),
        *("--data", f"{root}/quoting/{DATE}/data/heldout", "--output", f"{root}/quoting/{DATE}/eval/jax.json"),
        *("--num-hosts", "4", "--tpu-per-host", "4", "--accelerator-type", "TPU-V6E"),
    ]
    assert shlex.split(command) == [str(echo_python), *expected]
    assert run_as_ray_does(command) == expected
    assert not marker.exists()


def test_prep_and_training_jobs_quote_every_value(marker: Path, echo_python: Path) -> None:
    import json

    from tpuflow.rayjob.workload_operators import RayDataPrepOperator, RayTrainOperator

    cluster = {"backend": "local", "name": "c1", "dashboard_url": "http://127.0.0.1:1"}
    prep = RayDataPrepOperator(
        task_id="prep", cluster=cluster, module="addition.prep", arguments={"output_dir": hostile(marker), "date": DATE}
    )
    command = command_line(prep.build_entrypoint({}), str(echo_python))
    assert run_as_ray_does(command) == ["-m", "addition.prep", "--output-dir", hostile(marker), "--date", DATE]
    train = RayTrainOperator(
        task_id="train",
        framework="jax",
        train_loop="addition.train_jax:train_loop_per_worker",
        tpu_slice={"accelerator": "TPU-V6E", "topology": "4x4"},
        storage_path=hostile(marker),
        run_name="r",
        cluster=cluster,
    )
    argv = run_as_ray_does(
        command_line(train.build_entrypoint({"ti": SimpleNamespace(try_number=1)}), str(echo_python))
    )
    assert argv[:3] == ["-m", "tpuflow_driver.train", "--spec-json"]
    assert json.loads(argv[3])["storage_path"] == hostile(marker)
    assert not marker.exists()


def test_local_env_prints_export_lines_a_shell_evaluates_safely(
    marker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tpuflow.cli import local_cmd

    values = {"RAY_ADDRESS": "127.0.0.1:6379", "RAY_AUTH_TOKEN_PATH": f"{hostile(marker)}/auth_token"}
    monkeypatch.setattr(local_cmd, "_clusters", lambda args: [SimpleNamespace(client_env=lambda: values)])
    assert local_cmd._env(SimpleNamespace(name="c1")) == 0
    exports = capsys.readouterr().out
    shown = run_as_ray_does(f'{exports}\nprintf \'%s\\0\' "$RAY_ADDRESS" "$RAY_AUTH_TOKEN_PATH"')
    assert shown == list(values.values())
    assert not marker.exists()
