"""The addition demo's Workload and its own hyperparameter checks (moved out of tpuflow.validation)."""

from __future__ import annotations

import math
import subprocess
import sys
from datetime import datetime
from types import SimpleNamespace

import pytest
from tpuflow.workloads.addition.pipeline import ADDITION, check_params, check_train_loop_config

from tpuflow.errors import UserInputError


def test_the_demo_workload_names_the_demo_steps() -> None:
    assert ADDITION.code_dir is None  # shipped with tpuflow's own workloads (every job's working_dir)
    assert (ADDITION.prep, ADDITION.evaluate) == ("addition.prep", "addition.evaluate")
    assert ADDITION.train_loop == "addition.train_{framework}:train_loop_per_worker"
    assert (ADDITION.app_name, ADDITION.serve_app) == ("addition", "addition.serve_app:app_builder")
    assert ADDITION.load_check() is check_params


def test_training_options_the_train_loop_would_reject_on_the_cluster() -> None:
    check_train_loop_config("cfg", {"num_steps": 10, "learning_rate": 1e-3, "warmup_steps": 0, "my_option": "x"})
    check_train_loop_config("cfg", {"num_steps": "1500", "learning_rate": "6e-3"})  # rendered as text
    for config, fix in [
        ({"num_steps": "0"}, ">= 1"),
        ({"global_batch_size": 12.5}, "whole number"),
        ({"learning_rate": -0.1}, "> 0"),
        ({"learning_rate": math.nan}, "finite"),
        ({"final_lr_fraction": 2}, "<= 1"),
        ({"warmup_steps": True}, "whole number"),
    ]:
        with pytest.raises(UserInputError, match=rf"cfg\[{next(iter(config))}\]=.* is invalid: .*{fix}"):
            check_train_loop_config("cfg", config)


def test_the_params_that_become_training_options_are_checked_by_name() -> None:
    check_params({"train_steps": 1500, "framework": "jax"})
    with pytest.raises(UserInputError, match=r"^params.train_steps=0 is invalid: give a whole number >= 1$"):
        check_params({"train_steps": 0})
    check_params({"checkpoint_every": 50})
    with pytest.raises(UserInputError, match=r"^params.checkpoint_every=0 is invalid: give a whole number >= 1$"):
        check_params({"checkpoint_every": 0})


def test_the_checkpoint_every_param_sets_where_the_demos_loop_checkpoints(tmp_path) -> None:
    """The train task's config as the pipeline builds it, rendered for checkpoint_every=10: the loop checkpoints
    every 10 steps (and at the end), not at its default of 500."""
    from addition.training import fit, resolve_config
    from jinja2 import Template

    from tpuflow.pipeline.dag import tpu_pipeline

    dag = tpu_pipeline("ckpt_probe", workload=ADDITION, backend="local", output_root=str(tmp_path))
    params = {"train_steps": 25, "checkpoint_every": 10}
    run = SimpleNamespace(logical_date=datetime(2026, 11, 3), run_after=None)
    config = {
        k: Template(v).render(params=params, dag_run=run) for k, v in dag.get_task("train").train_loop_config.items()
    }
    # and, evaluated in training, where the loop finds the held-out set: prep's, for the run's date
    assert config["heldout"] == f"{tmp_path}/ckpt_probe/2026-11-03/data/heldout"
    checkpoints: list[int] = []
    fit(lambda b: 0.0, float, resolve_config(config), lambda e: iter(range(100)),
        on_checkpoint=lambda step, epoch, loss: checkpoints.append(step), log=lambda line: None)  # fmt: skip
    assert checkpoints == [10, 20, 25]


def test_the_spec_module_is_cheap_for_a_dag_file_to_import() -> None:
    code = "import sys, tpuflow.workloads.addition.pipeline; print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'jax', 'torch', 'numpy', 'airflow')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_serve_user_config_check_knows_the_replicas_own_settings() -> None:
    """The keys the demo workload's check accepts are the fields the replica reads (openai_api.Limits),
    and what the check refuses the replica would refuse once deployed."""
    from dataclasses import fields

    from addition.openai_api import Limits
    from tpuflow.workloads.addition.pipeline import USER_CONFIG_KEYS, check_user_config

    assert set(USER_CONFIG_KEYS) == {f.name for f in fields(Limits)}
    assert ADDITION.load_check("check_serve_user_config") is check_user_config
    check_user_config({"max_batch_size": 8, "batch_wait_timeout_s": 0, "request_timeout_s": 30}, {"name": "D"})
    for bad in ({"max_batch_size": 0}, {"batch_wait_timeout_s": 0.1}, {"retry_after_s": -1}, {"max_batch": 2}):
        with pytest.raises(UserInputError):
            check_user_config(bad, {"name": "D"})
        with pytest.raises(ValueError):
            Limits.from_user_config(bad)
