"""chain_on_failure: a create operator's own undo runs after the user's on_failure_callback(s), whichever shape
they were given in (one callable, a list, default_args, none), and Airflow calls them all."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import DAG, BaseOperator

from tpuflow.failure_callbacks import chain_on_failure


def _mine(context: Any) -> None:
    pass


def _ours(context: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, [_ours]), (_mine, [_mine, _ours]), ([_mine, _mine], [_mine, _mine, _ours])],
    ids=["none", "one", "a-list"],
)
def test_the_users_callbacks_stay_first(given: Any, expected: list[Any]) -> None:
    with DAG("cb", schedule=None):
        task = BaseOperator(task_id="t", on_failure_callback=given)
    chain_on_failure(task, _ours)
    assert task.on_failure_callback == expected


def test_default_args_callbacks_are_kept() -> None:
    with DAG("cb_defaults", schedule=None, default_args={"on_failure_callback": _mine}):
        task = BaseOperator(task_id="t")
    chain_on_failure(task, _ours)
    assert task.on_failure_callback == [_mine, _ours]
