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
        self.check_static_arguments()

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


def test_a_tpu_slice_is_a_static_value() -> None:
    tpu = TpuSlice.from_spec("v6e", "2x4")
    assert is_static(tpu) and is_static({"tpu_slice": tpu})
    assert not is_static({"tpu_slice": tpu, "n": "{{ params.n }}"})
