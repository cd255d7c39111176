"""The marker line through which every entrypoint hands its result to Airflow.

``TPUFLOW_RESULT <nonce> {json}``: the nonce is the job's own, which the operator generates for each submission
and puts in the job's metadata (``tpuflow_result_nonce``). Ray hands a job's metadata to its driver process only,
in the job config it sets in the driver's environment (``RAY_JOB_CONFIG_JSON_ENV_VAR``): the job's tasks and
actors (Ray Train's workers) are started by the raylet from the job's runtime_env and never see it. The
operator takes the LAST line of the job log that carries its job's nonce, so a worker's forwarded output, which
cannot know the nonce, never replaces the driver's result. Outside a Ray job (a test, a script run by hand)
there is no nonce and the line is ``TPUFLOW_RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MARKER = "TPUFLOW_RESULT"
# The job metadata key the operator sets (tpuflow.rayjob.hooks.RESULT_NONCE_KEY; the workloads cannot import
# tpuflow) and the variable in which Ray hands the job's config to its driver (ray._private.runtime_env.constants).
NONCE_KEY = "tpuflow_result_nonce"
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def result_nonce() -> str | None:
    """This job's nonce when this process is the job's driver, else None (a worker, or no Ray job)."""
    try:
        metadata = json.loads(os.environ.get(JOB_CONFIG_ENV) or "{}").get("metadata") or {}
    except (ValueError, AttributeError):
        return None
    nonce = metadata.get(NONCE_KEY) if isinstance(metadata, dict) else None
    return nonce if isinstance(nonce, str) and nonce and not any(c.isspace() for c in nonce) else None


def emit_result(result: dict[str, Any]) -> str:
    nonce = result_nonce()
    head = f"{MARKER} {nonce}" if nonce else MARKER
    line = f"{head} {json.dumps(result, sort_keys=True, default=str)}"
    sys.stdout.flush()
    print(line, flush=True)
    return line


def parse_result(log_text: str, nonce: str | None = None) -> dict[str, Any] | None:
    """The last result in a log (what the operator does; used by tests): with ``nonce``, only a line carrying it."""
    for line in reversed(log_text.splitlines()):
        if not line.startswith(MARKER + " "):
            continue
        rest = line[len(MARKER) + 1 :]
        if nonce is not None:
            if not rest.startswith(nonce + " "):
                continue
            rest = rest[len(nonce) + 1 :]
        elif not rest.startswith("{"):  # a nonce this caller does not check
            rest = rest.partition(" ")[2]
        return json.loads(rest)
    return None
