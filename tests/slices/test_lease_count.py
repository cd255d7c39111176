"""A lease is one slice: a multi-slice run takes all its leases together, or none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tpuflow.errors import UserInputError
from tpuflow.slices.leases import LocalLeaseStore, parse_count


def test_two_slices_take_two_leases_and_a_retry_keeps_them(tmp_path: Path) -> None:
    store = LocalLeaseStore(tmp_path)
    first = store.try_acquire("dag/a", 3, count=2)
    assert first is not None and first.slot == 0
    assert sorted(store.holders(3)) == [0, 1]
    assert store.try_acquire("dag/a", 3, count=2) == first  # a retry takes nothing more
    assert sorted(store.holders(3)) == [0, 1]
    assert store.release("dag/a") == [0, 1]


def test_not_enough_free_takes_nothing(tmp_path: Path) -> None:
    store = LocalLeaseStore(tmp_path)
    assert store.try_acquire("dag/a", 3) is not None
    assert store.try_acquire("dag/b", 3, count=3) is None
    assert sorted(store.holders(3)) == [0]  # b holds nothing while it waits
    assert store.try_acquire("dag/b", 3, count=2) is not None
    assert sorted(lease.holder for lease in store.holders(3).values()) == ["dag/a", "dag/b", "dag/b"]


def test_more_slices_than_the_leases_allow_is_one_line_before_anything_starts() -> None:
    assert parse_count("2", 2) == 2
    with pytest.raises(UserInputError) as err:
        parse_count(3, 2)
    assert err.value.field == "num_slices" and "allow 2 slice(s)" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserInputError):
        parse_count(0, 2)


def test_acquire_task_fails_at_once_above_the_limit(tmp_path: Path) -> None:
    from support.airflow_context import task_context

    from tpuflow.slices.operators import TPUAcquireSliceOperator

    two = {"accelerator": "v6e", "topology": "2x2", "num_slices": 2}
    with pytest.raises(UserInputError, match=r"^tpu_slice\.num_slices=2 is invalid: the slice leases allow 1"):
        TPUAcquireSliceOperator(task_id="acquire_slice", max_slices=1, tpu_slice=two, lease_root=str(tmp_path))
    with pytest.raises(TypeError):
        TPUAcquireSliceOperator(task_id="acquire_slice", num_slices=2, lease_root=str(tmp_path))  # type: ignore[call-arg]
    templated = TPUAcquireSliceOperator(
        task_id="acquire_slice",
        max_slices="{{ x }}",
        tpu_slice={**two, "num_slices": "{{ y }}"},
        lease_root=str(tmp_path),
    )
    templated.max_slices, templated.tpu_slice = "2", {**two, "num_slices": "2"}
    claimed = templated.execute(task_context())
    assert claimed["num_slices"] == 2 and len(LocalLeaseStore(tmp_path).holders(2)) == 2


def test_the_wait_counts_the_slices_it_needs(tmp_path: Path) -> None:
    from tpuflow.slices.triggers import SliceLeaseTrigger

    store = LocalLeaseStore(tmp_path)
    store.try_acquire("dag/a", 3)
    trigger = SliceLeaseTrigger(str(tmp_path), 3, "dag/b", poll_interval=0.05, timeout=0.3, count=3)
    assert trigger.serialize()[1]["count"] == 3

    async def first_event() -> dict:
        return dict((await trigger.run().__anext__()).payload)

    assert asyncio.run(first_event())["status"] == "timeout"  # two free, three needed
    store.release("dag/a")
    assert asyncio.run(first_event())["status"] == "success"
