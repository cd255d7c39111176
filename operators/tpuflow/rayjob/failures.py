"""Tell infrastructure failures (retry) from errors in the user's code (fail at once).

Retrying a job whose code raises wastes a slice's time and hides the traceback behind
retries; retrying a job whose host was preempted is exactly what should happen.
"""

from __future__ import annotations

import re

from airflow.sdk.exceptions import AirflowFailException

from tpuflow.errors import UserInputError

# Ray's own words for lost capacity or broken infrastructure (worker/host loss, preemption, OOM kills).
_INFRA_PATTERNS = [
    r"NodeDiedError",
    r"ActorDiedError",
    r"ActorUnavailableError",
    r"RaySystemError",
    r"ObjectLostError",
    r"OwnerDiedError",
    r"WorkerCrashedError",
    r"RayActorError",
    r"OutOfMemoryError",
    r"node .* (has been marked dead|was terminated|died)",
    r"The actor died unexpectedly",
    r"Job supervisor actor (died|could not be scheduled)",
    r"job driver (was terminated|exited unexpectedly)",
    r"TPU .*(preempt|unavailable)",
    r"GCE_STOCKOUT",
    r"ZONE_RESOURCE_POOL_EXHAUSTED",
    r"Connection (refused|reset)",
    r"PlacementGroup.*(timed out|could not be scheduled)",
    r"(gRPC|grpc).*UNAVAILABLE",
    r"TrainingFailedError.*Worker.*died",
    r"storage call stalled",  # tpuflow_driver.deadline_fs: the storage server stopped answering
]
_INFRA = re.compile("|".join(f"(?:{p})" for p in _INFRA_PATTERNS), re.IGNORECASE)
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")


class UserInputFailure(UserInputError, AirflowFailException):
    """A UserInputError that fails the task without using its retries: the same input fails the same way."""


def is_user_code_error(status: str, message: str, log_tail: str) -> bool:
    """A FAILED job whose log shows a Python traceback and nothing that points at infrastructure."""
    if status != "FAILED":
        return False
    text = f"{message}\n{log_tail}"
    return bool(_TRACEBACK.search(text)) and not _INFRA.search(text)
