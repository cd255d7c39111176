"""tpuflow.arguments: one check list, run on static values at parse time and on rendered values in execute."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import BaseOperator

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.errors import UserInputError
from tpuflow.templating import is_static
from tpuflow.tpu import TpuSlice
from tpuflow.validation import check_count


class SizedOperator(ArgumentChecks, BaseOperator):
    template_fields = ("size",)

    def __init__(self, *, size: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = size

    def argument_checks(self) -> list[ArgumentCheck]:
        return [*super().argument_checks(), ((self.size,), lambda: check_count("size", self.size, minimum=1))]


def test_a_bad_literal_fails_when_the_dag_is_parsed() -> None:
    with pytest.raises(UserInputError, match="size"):
        SizedOperator(task_id="t", size=0)


def test_a_template_waits_for_its_rendered_value() -> None:
    op = SizedOperator(task_id="t", size="{{ params.size }}")  # nothing to check yet
    op.size = "0"  # what rendering gave
    with pytest.raises(UserInputError, match="size"):
        op.validate_arguments()
    op.size = 3
    op.validate_arguments()


class CountingOperator(SizedOperator):
    """A team's subclass: its own __init__ sets what its own check reads, after the base's __init__."""

    runs: list[str] = []

    def __init__(self, *, team: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.team = team

    def argument_checks(self) -> list[ArgumentCheck]:
        return [*super().argument_checks(), ((self.team,), lambda: self.runs.append(self.team))]


def test_the_parse_time_checks_run_once_after_the_outermost_init() -> None:
    CountingOperator.runs = []
    op = CountingOperator(task_id="t", size=2, team="mine")  # the base's checks would fail without team
    assert CountingOperator.runs == ["mine"]
    assert not any("init_depth" in key for key in vars(op)), "the bookkeeping stays out of the operator"
    with pytest.raises(UserInputError, match="size"):
        CountingOperator(task_id="u", size=0, team="mine")


def test_a_subclass_without_its_own_init_is_checked_too() -> None:
    class Plain(SizedOperator):
        pass

    with pytest.raises(UserInputError, match="size"):
        Plain(task_id="t", size=-1)


def test_a_tpu_slice_is_a_static_value() -> None:
    tpu = TpuSlice.from_spec("v6e", "2x4")
    assert is_static(tpu) and is_static({"tpu_slice": tpu})
    assert not is_static({"tpu_slice": tpu, "n": "{{ params.n }}"})
