"""The marker line through which every entrypoint hands its result to Airflow.

The operator parses the LAST line starting with the marker in the job's log.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MARKER = "TPUFLOW_RESULT"


def emit_result(result: dict[str, Any]) -> str:
    line = f"{MARKER} {json.dumps(result, sort_keys=True, default=str)}"
    sys.stdout.flush()
    print(line, flush=True)
    return line


def parse_result(log_text: str) -> dict[str, Any] | None:
    """The last result in a log (what the operator does; used by tests)."""
    for line in reversed(log_text.splitlines()):
        if line.startswith(MARKER + " "):
            return json.loads(line[len(MARKER) + 1 :])
    return None
