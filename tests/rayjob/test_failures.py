"""Which failed jobs Airflow should retry."""

import pytest

from tpuflow.rayjob.failures import is_user_code_error

USER_TRACE = "Traceback (most recent call last):\n  File \"train.py\", line 3\nKeyError: 'lr'"


@pytest.mark.parametrize(
    ("status", "message", "tail", "user"),
    [
        ("FAILED", "", USER_TRACE, True),
        ("FAILED", "Job entrypoint command failed with exit code 1", USER_TRACE, True),
        ("FAILED", "", USER_TRACE + "\nray.exceptions.ActorDiedError: The actor died unexpectedly", False),
        (
            "FAILED",
            "",
            "Traceback (most recent call last):\nray.exceptions.NodeDiedError: node 3 has been marked dead",
            False,
        ),
        ("FAILED", "Job supervisor actor died", "", False),
        ("FAILED", "", "worker killed: OutOfMemoryError", False),
        ("STOPPED", "", USER_TRACE, False),
        ("TIMEOUT", "", USER_TRACE, False),
    ],
)
def test_classification(status, message, tail, user):
    assert is_user_code_error(status, message, tail) is user
