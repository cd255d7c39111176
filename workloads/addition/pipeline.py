"""The addition demo as the pipeline runs it: its Workload, its smoke test and its hyperparameter checks.

Airflow-side only: the DAG files import ``tpuflow.workloads.addition.pipeline`` while they are parsed (this
module imports tpuflow, and nothing of jax, torch or ray), and the check runs in the ``check_params``
task. No module of the addition package that runs on the Ray cluster imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuflow.errors import UserInputError
from tpuflow.pipeline.workload import Workload

SERVE_APP = "addition"
SERVE_DEPLOYMENT = "AdditionCompletions"  # serve_app's deployment (its `deployments:` entry name)
PROMPT, ANSWER = "17+25=", "42"

# The demo's training options (addition.training.DEFAULTS) and what each accepts: what the train loop
# would reject on the cluster, once the slice is up, is rejected by the check_params task.
TRAIN_COUNTS = {"num_steps": 1, "global_batch_size": 1, "checkpoint_every": 1, "log_every": 1, "warmup_steps": 0}
TRAIN_NUMBERS: dict[str, tuple[float, float | None, bool]] = {
    # key: (minimum, maximum, minimum excluded)
    "learning_rate": (0.0, None, True),
    "weight_decay": (0.0, None, False),
    "grad_clip": (0.0, None, True),
    "final_lr_fraction": (0.0, 1.0, False),
}
# The Params that become training options (tpuflow.pipeline.factory.training_steps' train_loop_config).
PARAM_OPTIONS = {"train_steps": "num_steps"}


def _parsed(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_train_loop_config(field: str, config: Mapping[str, Any] | None) -> None:
    """The demo's training options in a train_loop_config, where present (a rendered template's text too)."""
    from tpuflow.validation import check_count, check_number

    for key, raw in (config or {}).items():
        name = f"{field}[{key}]"
        value = _parsed(raw) if isinstance(raw, str) and (key in TRAIN_COUNTS or key in TRAIN_NUMBERS) else raw
        try:
            if key in TRAIN_COUNTS:
                check_count(name, value, minimum=TRAIN_COUNTS[key])
            elif key in TRAIN_NUMBERS:
                low, high, above = TRAIN_NUMBERS[key]
                check_number(name, value, minimum=low, maximum=high, above=above)
        except UserInputError as err:
            raise UserInputError(name, raw, err.fix) from None


def check_params(params: Mapping[str, Any]) -> None:
    """The run's Params that become the demo's training options (Workload.check_params)."""
    for param, option in PARAM_OPTIONS.items():
        if param in params:
            try:
                check_train_loop_config("train_loop_config", {option: params[param]})
            except UserInputError as err:
                raise UserInputError(f"params.{param}", err.value, err.fix) from None


ADDITION = Workload(
    prep="addition.prep",
    train_loop="addition.train_{framework}:train_loop_per_worker",
    evaluate="addition.evaluate",
    serve_app="addition.serve_app:app_builder",
    serve_name=SERVE_APP,
    serve_deployment=SERVE_DEPLOYMENT,
    smoke_request={"model": SERVE_APP, "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
    smoke_expect=ANSWER,
    check_params="tpuflow.workloads.addition.pipeline:check_params",
)
