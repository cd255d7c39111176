"""A Ray job's secret environment values, redacted by Airflow's own secrets masker wherever the job is followed.

A job's environment (``env_vars``, a training run's ``worker_env``) travels in its runtime_env, never on its
command line. Its driver may still print a value (a library echoing its settings), and the driver log streams into
the task log: from the worker, or from the triggerer while the task is deferred. So whichever process follows the
job registers the values of sensitive-named variables (``HF_TOKEN``, ``WANDB_API_KEY``, ...: Airflow's list,
extended by ``[core] sensitive_var_conn_names``) with Airflow's masker, which also tells that process's
supervisor, the one that writes the task log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk._shared.secrets_masker import should_hide_value_for_key  # where Airflow 3.3 points to
from airflow.sdk.log import amask_secret


def sensitive_env(runtime_env: Any) -> dict[str, str]:
    """The variables of a runtime_env whose names Airflow deems sensitive (only those: masking a short
    non-secret value would only warn)."""
    env_vars = runtime_env.get("env_vars") if isinstance(runtime_env, Mapping) else None
    if not isinstance(env_vars, Mapping):
        return {}
    return {str(name): str(value) for name, value in env_vars.items() if should_hide_value_for_key(str(name))}


async def amask_job_secrets(job_info: Mapping[str, Any]) -> None:
    """Mask the sensitive values of the runtime_env a job was submitted with (Ray's job details echo it)."""
    for name, value in sensitive_env(job_info.get("runtime_env")).items():
        await amask_secret(value, name)
