"""Slice leases: the atomic claim, retries keeping their slot, release, and the deferrable wait."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from support.airflow_context import task_context

from tpuflow.errors import UserInputError
from tpuflow.slices.leases import LocalLeaseStore, lease_store, parse_slots


def _claim(root: str, holder: str, queue: Any) -> None:
    lease = LocalLeaseStore(root).try_acquire(holder, 2)
    queue.put((holder, None if lease is None else lease.slot))


def test_concurrent_claims_never_exceed_the_limit(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path), f"dag/run-{i}", queue)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    results = dict(queue.get(timeout=5) for _ in procs)
    won = {h: s for h, s in results.items() if s is not None}
    assert sorted(won.values()) == [0, 1], results
    assert {lease.holder for lease in LocalLeaseStore(tmp_path).holders(2).values()} == set(won)


def test_retry_keeps_its_slot_and_release_frees_it(tmp_path: Path) -> None:
    store = LocalLeaseStore(tmp_path)
    first = store.try_acquire("dag/a", 1)
    assert first is not None and first.slot == 0
    assert store.try_acquire("dag/a", 1) == first  # a retry of the same run
    assert store.try_acquire("dag/b", 1) is None
    assert store.release("dag/b") == []
    assert store.release("dag/a") == [0]
    assert store.try_acquire("dag/b", 1) is not None


def test_release_finds_a_slot_above_a_lowered_limit(tmp_path: Path) -> None:
    store = LocalLeaseStore(tmp_path)
    store.try_acquire("dag/a", 3)
    store.try_acquire("dag/b", 3)
    assert store.release("dag/b") == [1]


def test_bad_limits_and_roots_are_user_errors() -> None:
    assert parse_slots("2") == 2
    for bad in ("0", "-1", "x", None):
        with pytest.raises(UserInputError):
            parse_slots(bad)  # type: ignore[arg-type]
    with pytest.raises(UserInputError):
        lease_store("s3://bucket/leases")


def test_trigger_waits_until_a_slot_frees_and_serializes(tmp_path: Path) -> None:
    from airflow.serialization.serialized_objects import BaseSerialization

    from tpuflow.slices.triggers import SliceLeaseTrigger

    store = LocalLeaseStore(tmp_path)
    store.try_acquire("dag/a", 1)
    trigger = SliceLeaseTrigger(str(tmp_path), 1, "dag/b", poll_interval=0.05, timeout=5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "tpuflow.slices.triggers.SliceLeaseTrigger"
    BaseSerialization.serialize(kwargs, strict=True)  # plain JSON values only

    async def scenario() -> dict[str, Any]:
        gen = trigger.run()
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.3)
        assert not task.done(), "fired while the only slot was held"
        store.release("dag/a")
        event = await asyncio.wait_for(task, 5)
        return dict(event.payload)

    assert asyncio.run(scenario())["status"] == "success"  # the tpuflow.events shape


def test_trigger_times_out(tmp_path: Path) -> None:
    from tpuflow.slices.triggers import SliceLeaseTrigger

    LocalLeaseStore(tmp_path).try_acquire("dag/a", 1)
    trigger = SliceLeaseTrigger(str(tmp_path), 1, "dag/b", poll_interval=0.05, timeout=0.2)

    async def first() -> dict[str, Any]:
        return dict((await trigger.run().__anext__()).payload)

    event = asyncio.run(first())
    assert {k: event[k] for k in ("status", "held")} == {"status": "timeout", "held": ["dag/a"]}
    assert "dag/a" in event["message"]


def test_acquire_operator_claims_or_defers(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from tpuflow.slices.operators import TPUAcquireSliceOperator, TPUReleaseSliceOperator

    ctx_a = task_context(dag_id="dag", run_id="a")
    ctx_b = task_context(dag_id="dag", run_id="b")
    op = TPUAcquireSliceOperator(task_id="acquire_slice", lease_root=str(tmp_path), max_slices="1")
    assert op.execute(ctx_a)["slot"] == 0  # type: ignore[arg-type]
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx_b)  # type: ignore[arg-type]
    assert deferred.value.trigger.holder == "dag/b"
    TPUReleaseSliceOperator(task_id="release_slice", lease_root=str(tmp_path)).execute(ctx_a)  # type: ignore[arg-type]
    assert op.execute_complete(ctx_b, {"status": "success", "message": "free"})["holder"] == "dag/b"  # type: ignore[arg-type]


def test_a_non_deferrable_acquire_waits_in_the_worker_through_the_triggers_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """deferrable=False: the same wait (wait_for_free_slot) with asyncio.run, its event through execute_complete."""
    import threading

    from airflow.sdk.exceptions import AirflowException

    from tpuflow.slices.operators import TPUAcquireSliceOperator

    store = LocalLeaseStore(tmp_path)
    assert store.try_acquire("dag/a", 1) is not None
    args = {"task_id": "acquire_slice", "lease_root": str(tmp_path), "max_slices": "1", "poll_interval": 0.05}
    with pytest.raises(AirflowException, match=r"waiting for a slice lease \(wait_timeout=0.3s\): timeout: .*dag/a"):
        TPUAcquireSliceOperator(deferrable=False, wait_timeout=0.3, **args).execute(
            task_context(dag_id="dag", run_id="b")
        )  # type: ignore[arg-type]
    assert "are held (dag/a): waiting in this worker" in capsys.readouterr().out

    threading.Timer(0.3, store.release, args=("dag/a",)).start()
    taken = TPUAcquireSliceOperator(deferrable=False, **args).execute(task_context(dag_id="dag", run_id="b"))  # type: ignore[arg-type]
    assert taken["holder"] == "dag/b" and [lease.holder for lease in store.holders(1).values()] == ["dag/b"]


def test_cli_lists_and_frees_leases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tpuflow.cli import main

    LocalLeaseStore(tmp_path).try_acquire("dag/killed-run", 1)
    assert main(["leases", "list", "--lease-root", str(tmp_path)]) == 0
    assert "slot 0: dag/killed-run" in capsys.readouterr().out
    assert main(["leases", "free", "--lease-root", str(tmp_path), "dag/killed-run"]) == 0
    assert main(["leases", "free", "--lease-root", str(tmp_path), "dag/killed-run"]) == 1
    assert LocalLeaseStore(tmp_path).holders(1) == {}


def test_a_lease_wait_that_timed_out_fails_the_task_naming_the_holders(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowException

    from tpuflow.slices.operators import TPUAcquireSliceOperator

    op = TPUAcquireSliceOperator(task_id="acquire_slice", lease_root=str(tmp_path), wait_timeout=1)
    with pytest.raises(AirflowException, match="timeout: .*held by dag/a"):
        op.execute_complete(
            task_context(dag_id="dag", run_id="b"),
            {"status": "timeout", "message": "held by dag/a", "held": ["dag/a"]},
        )


def test_lease_arguments_are_checked_at_parse_time_when_static_and_at_run_time_when_templated(tmp_path: Path) -> None:
    from tpuflow.slices.operators import TPUAcquireSliceOperator, TPUReleaseSliceOperator

    with pytest.raises(UserInputError, match="max_slices='0'"):
        TPUAcquireSliceOperator(task_id="acquire_slice", max_slices="0")
    with pytest.raises(UserInputError, match="lease_root='s3://bucket/leases'"):
        TPUReleaseSliceOperator(task_id="release_slice", lease_root="s3://bucket/leases")
    op = TPUAcquireSliceOperator(
        task_id="acquire_slice", lease_root=str(tmp_path), max_slices="{{ var.value.get('tpuflow_max_slices', 1) }}"
    )  # not checked yet
    op.max_slices = "none"  # what the template rendered to
    with pytest.raises(UserInputError, match="max_slices='none'"):
        op.execute(task_context(dag_id="dag", run_id="a"))  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # failed before claiming anything


@pytest.mark.parametrize(
    ("state", "reclaimed"), [("failed", True), ("success", True), (None, True), ("running", False)]
)
def test_a_lease_left_by_a_run_that_is_over_does_not_block_the_next_run(
    tmp_path: Path, state: str | None, reclaimed: bool
) -> None:
    """A run killed before its teardown (marked failed, or deleted from the metadata DB: state None) keeps
    its lease file; the next run's acquire gives it back and takes the slice. A live run's lease is kept."""
    from airflow.sdk.exceptions import TaskDeferred
    from support.airflow_context import FakeTaskInstance

    from tpuflow.slices.operators import TPUAcquireSliceOperator

    store = LocalLeaseStore(tmp_path)
    assert store.try_acquire("dag/killed", 1) is not None
    op = TPUAcquireSliceOperator(task_id="acquire_slice", lease_root=str(tmp_path), max_slices="1")
    ctx = task_context(FakeTaskInstance(dag_id="dag", run_id="next", run_states={"dag/killed": state}))
    if reclaimed:
        assert op.execute(ctx)["holder"] == "dag/next"  # type: ignore[arg-type]
        assert [lease.holder for lease in store.holders(1).values()] == ["dag/next"]
    else:
        with pytest.raises(TaskDeferred):
            op.execute(ctx)  # type: ignore[arg-type]
        assert [lease.holder for lease in store.holders(1).values()] == ["dag/killed"]


def test_a_run_whose_state_cannot_be_read_keeps_its_lease(tmp_path: Path) -> None:
    from tpuflow.slices.operators import run_is_over

    class Unreachable:
        def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
            raise ConnectionError("execution API unreachable")

    assert run_is_over(Unreachable(), "dag", "r") is None
