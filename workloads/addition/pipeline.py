"""The addition demo as the pipeline runs it: its Workload, its smoke test, its hyperparameter checks and
the check of its Serve deployment's user_config (the replica's request limits and batching).

Airflow-side only: the DAG files import ``tpuflow.workloads.addition.pipeline`` while they are parsed (this
module imports tpuflow, and nothing of jax, torch or ray), and the check runs in the ``check_params``
task. No module of the addition package that runs on the Ray cluster imports it.
"""

from __future__ import annotations

import math
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
# The replica's own settings, its Serve user_config (addition.openai_api.Limits' fields). Without
# max_batch_size the app batches (32) on a multi-host replica only (serve_app.MULTI_HOST_MAX_BATCH_SIZE):
# that default depends on the slice, so it stays the app's and the Workload declares no serve_user_config.
USER_CONFIG_SECONDS = ("request_timeout_s", "retry_after_s")
USER_CONFIG_COUNTS = ("max_inflight_requests", "max_concurrent_forward", "max_batch_size")
USER_CONFIG_KEYS = (*USER_CONFIG_SECONDS, *USER_CONFIG_COUNTS, "batch_wait_timeout_s")
USER_CONFIG_FIELD = "deployment_options.user_config"

# The Params that become training options (tpuflow.pipeline.factory.training_steps' train_loop_config).
PARAM_OPTIONS = {"train_steps": "num_steps", "checkpoint_every": "checkpoint_every"}


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


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_user_config_values(config: Mapping[str, Any]) -> None:
    for key in USER_CONFIG_SECONDS:
        value = config.get(key)
        if value is not None and not (_is_number(value) and value > 0):
            raise UserInputError(f"{USER_CONFIG_FIELD}.{key}", value, "give a positive, finite number of seconds")
    for key in USER_CONFIG_COUNTS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserInputError(f"{USER_CONFIG_FIELD}.{key}", value, "give a whole number >= 1")
    wait = config.get("batch_wait_timeout_s")
    if wait is not None:
        field = f"{USER_CONFIG_FIELD}.batch_wait_timeout_s"
        if not (_is_number(wait) and wait >= 0):
            raise UserInputError(field, wait, "give a finite number of seconds >= 0")
        if config.get("max_batch_size") is None:
            raise UserInputError(field, wait, "batching is off without max_batch_size; set it too")


def check_user_config(user_config: Mapping[str, Any], deployment: Mapping[str, Any]) -> None:
    """The replica's limits and batching (Workload.check_serve_user_config), as addition.openai_api.Limits
    would refuse them once deployed; ``deployment``: the app's ``deployments:`` entry."""
    unknown = sorted(set(user_config) - set(USER_CONFIG_KEYS))
    if unknown:
        raise UserInputError(USER_CONFIG_FIELD, unknown, f"the demo app reads only {', '.join(USER_CONFIG_KEYS)}")
    _check_user_config_values(user_config)
    ongoing = deployment.get("max_ongoing_requests")
    for key in ("max_inflight_requests", "max_batch_size"):
        value = user_config.get(key)
        if value is not None and ongoing is not None and value > ongoing:
            raise UserInputError(
                f"{USER_CONFIG_FIELD}.{key}",
                value,
                f"a replica never sees more than max_ongoing_requests ({ongoing}) at once; "
                "lower it or raise max_ongoing_requests",
            )


ADDITION = Workload(
    prep="addition.prep",
    train_loop="addition.train_{framework}:train_loop_per_worker",
    evaluate="addition.evaluate",
    # on the training workers after the last step (addition.heldout); addition.evaluate stays for a run of its own
    evaluate_in_training=True,
    serve_app="addition.serve_app:app_builder",
    serve_name=SERVE_APP,
    serve_deployment=SERVE_DEPLOYMENT,
    smoke_request={"model": SERVE_APP, "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
    smoke_expect=ANSWER,
    check_params="tpuflow.workloads.addition.pipeline:check_params",
    check_serve_user_config="tpuflow.workloads.addition.pipeline:check_user_config",
)
