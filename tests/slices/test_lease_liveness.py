"""A killed run never blocks the next: a lease names its supervising process, and a waiter takes over
the lease of a provably dead one (exited, pid reused, host rebooted) and says so; a live one keeps it.
Stray files in the lease folder are no leases, and the slot count is bounded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support.airflow_context import task_context
from support.processes import dead_process_record

from tpuflow import liveness
from tpuflow.errors import UserInputError
from tpuflow.slices.leases import MAX_LEASE_SLOTS, LocalLeaseStore, parse_slots


class Recorder:
    """A logger that keeps each formatted line (an operator's log)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _keep(self, msg: str, *args: Any, **_: Any) -> None:
        self.lines.append(msg % args if args else msg)

    info = warning = error = debug = _keep


def _hold(root: Path, holder: str, record: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setenv(liveness.SUPERVISOR_ENV, json.dumps(record))
        assert LocalLeaseStore(root).try_acquire(holder, 1) is not None


def _acquire(root: Path) -> Any:
    from tpuflow.slices.operators import TPUAcquireSliceOperator

    return TPUAcquireSliceOperator(task_id="acquire_slice", lease_root=str(root), max_slices="1")


def test_a_lease_records_its_supervising_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = liveness.process_record()
    _hold(tmp_path, "dag/a", me, monkeypatch)
    lease = LocalLeaseStore(tmp_path).holders(1)[0]
    assert lease.supervisor == me and lease.dead_reason() is None
    assert lease.holder_line() == f"dag/a (pid {me['pid']} on host {me['host']})"


def test_a_lease_of_a_dead_supervisor_is_taken_over_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(liveness.SUPERVISOR_ENV, raising=False)
    dead = dead_process_record()
    _hold(tmp_path, "dag/killed", dead, monkeypatch)
    assert _acquire(tmp_path).execute(task_context(dag_id="dag", run_id="next"))["holder"] == "dag/next"
    assert [lease.holder for lease in LocalLeaseStore(tmp_path).holders(1).values()] == ["dag/next"]
    assert f"took over slice lease 0 of dag/killed: its supervisor pid {dead['pid']} exited" in capsys.readouterr().out
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing set aside is left


def test_a_lease_of_a_live_supervisor_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    me = liveness.process_record()
    _hold(tmp_path, "dag/alive", me, monkeypatch)
    with pytest.raises(TaskDeferred):
        _acquire(tmp_path).execute(task_context(dag_id="dag", run_id="next"))
    assert [lease.holder for lease in LocalLeaseStore(tmp_path).holders(1).values()] == ["dag/alive"]
    out = capsys.readouterr().out
    assert f"held (dag/alive (pid {me['pid']} on host {me['host']})" in out and "took over" not in out


def test_a_reused_pid_and_a_rebooted_host_are_dead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUFLOW_HOME", str(tmp_path))  # a home of its own: a fresh machine has no ~/.tpuflow yet
    me = liveness.process_record()  # remembers this boot (tpuflow_home()/boot-ids)
    assert liveness.dead_reason(me) is None
    assert liveness.dead_reason({**me, "start": me["start"] - 1}) == f"pid {me['pid']} was reused"
    assert liveness.dead_reason({**me, "host": "elsewhere"}) is None  # not provable here: alive
    assert liveness.dead_reason({**me, "boot_id": "another-machines-boot"}) is None  # a boot this one never had
    assert liveness.dead_reason(None) is None
    monkeypatch.setattr(liveness, "boot_id", lambda: "this-machine-after-a-reboot")
    assert liveness.dead_reason(me) == f"host {me['host']} rebooted"


def test_the_waiting_trigger_fires_for_a_dead_holder_and_names_a_live_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.slices.triggers import wait_for_free_slot

    store = LocalLeaseStore(tmp_path)
    _hold(tmp_path, "dag/alive", liveness.process_record(), monkeypatch)
    log = Recorder()

    async def wait() -> dict[str, Any]:
        return await wait_for_free_slot(store, slots=1, holder="dag/b", deadline=0, poll_interval=0.01, log=log)

    assert asyncio.run(wait())["status"] == "timeout"
    assert any(line.startswith("all 1 slice lease(s) held by dag/alive (pid ") for line in log.lines), log.lines
    store.release("dag/alive")
    _hold(tmp_path, "dag/killed", dead_process_record(), monkeypatch)
    assert asyncio.run(wait())["status"] == "success"


def test_stray_files_in_the_lease_folder_are_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(liveness.SUPERVISOR_ENV, raising=False)
    (tmp_path / "notes.txt").write_text("who holds what")
    (tmp_path / "slot-x.json").write_text("{}")
    (tmp_path / "slot-3.json").write_text("not json {")
    (tmp_path / "slot-4.json").write_text("[1, 2]")
    store = LocalLeaseStore(tmp_path)
    assert store.try_acquire("dag/a", 2) is not None
    assert store.release("dag/b") == []
    assert store.release("dag/a") == [0]
    assert {s: lease.holder for s, lease in store.all_holders().items()} == {3: "?", 4: "?"}
    assert (tmp_path / "notes.txt").exists()


def test_max_slices_over_the_maximum_is_one_clear_line() -> None:
    from tpuflow.slices.operators import TPUAcquireSliceOperator

    assert parse_slots(MAX_LEASE_SLOTS) == MAX_LEASE_SLOTS
    with pytest.raises(UserInputError) as err:
        TPUAcquireSliceOperator(task_id="acquire_slice", max_slices=str(MAX_LEASE_SLOTS + 1))
    assert err.value.field == "max_slices" and f"at most {MAX_LEASE_SLOTS}" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_gs_lease_expires_unless_renewed_and_stray_objects_are_ignored(
    gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On GKE no process can be checked: a gs:// lease carries an expiry its run renews by taking it again."""
    import time
    import uuid

    from tpuflow.slices import leases
    from tpuflow.storage import gcs_client
    from tpuflow_rehearsal.gcs_emulator import EMULATOR_ENV, ensure_buckets

    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)
    monkeypatch.delenv(liveness.SUPERVISOR_ENV, raising=False)
    bucket = f"tpuflow-test-{uuid.uuid4().hex[:10]}"
    ensure_buckets(gcs_emulator.url, [bucket])
    for name, text in (("leases/notes.txt", "hi"), ("leases/slot-x.json", "{}"), ("leases/slot-7.json", "not json")):
        gcs_client().bucket(bucket).blob(name).upload_from_string(text)
    store = leases.lease_store(f"gs://{bucket}/leases")
    assert store.try_acquire("dag/a", 1) is not None
    first = store.holders(1)[0]
    assert first.expires_at is not None and abs(first.expires_at - (time.time() + leases.LEASE_TTL_S)) < 60
    time.sleep(0.05)
    assert store.try_acquire("dag/a", 1) is not None  # a retry renews the expiry
    assert store.holders(1)[0].expires_at > first.expires_at  # type: ignore[operator]
    assert store.take_over_dead(1, "dag/b") == []  # not expired: kept
    assert store.release("dag/b") == [] and sorted(store.all_holders()) == [0, 7]

    monkeypatch.setattr(leases, "LEASE_TTL_S", -1.0)  # a lease that is already past its expiry
    assert store.release("dag/a") == [0]
    assert store.try_acquire("dag/gone", 1) is not None
    [(lease, reason)] = store.take_over_dead(1, "dag/b")
    assert lease.holder == "dag/gone" and reason.startswith("past its expiry")
    assert store.try_acquire("dag/b", 1) is not None


def test_an_expired_gs_lease_of_a_running_run_is_renewed_not_taken_over(
    gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A training that outlives the expiry keeps its slice while the metadata DB says its run is running; the
    renewal keeps the holder's own supervisor record. A run whose state cannot be read loses the expired lease."""
    import time
    import uuid

    from airflow.sdk.exceptions import TaskDeferred
    from support.airflow_context import FakeTaskInstance

    from tpuflow.slices import leases
    from tpuflow.slices.operators import TPUAcquireSliceOperator
    from tpuflow_rehearsal.gcs_emulator import EMULATOR_ENV, ensure_buckets

    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)
    bucket = f"tpuflow-test-{uuid.uuid4().hex[:10]}"
    ensure_buckets(gcs_emulator.url, [bucket])
    root = f"gs://{bucket}/leases"
    holder_supervisor = liveness.process_record()
    with monkeypatch.context() as m:
        m.setenv(liveness.SUPERVISOR_ENV, json.dumps(holder_supervisor))
        m.setattr(leases, "LEASE_TTL_S", -1.0)  # taken long ago: already past its expiry
        assert leases.lease_store(root).try_acquire("train_dag/long", 1) is not None
    monkeypatch.delenv(liveness.SUPERVISOR_ENV, raising=False)
    acquire = TPUAcquireSliceOperator(task_id="acquire_slice", lease_root=root, max_slices="1")
    waiter = FakeTaskInstance(dag_id="train_dag", run_id="next", run_states={"train_dag/long": "running"})
    with pytest.raises(TaskDeferred):
        acquire.execute(task_context(waiter))
    (lease,) = leases.lease_store(root).holders(1).values()
    assert lease.holder == "train_dag/long" and lease.dead_reason() is None
    assert lease.expires_at is not None and lease.expires_at > time.time() + leases.LEASE_TTL_S - 60
    assert lease.supervisor == holder_supervisor
    out = capsys.readouterr().out
    assert "renewed the expired slice lease 0 of train_dag/long: the run is still running" in out

    class StateUnreadable(FakeTaskInstance):
        def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
            raise ConnectionError("execution API unreachable")

    monkeypatch.setattr(leases, "LEASE_TTL_S", -1.0)
    leases.lease_store(root).renew("train_dag/long", 1)  # expired again
    taken = acquire.execute(task_context(StateUnreadable(dag_id="train_dag", run_id="next")))
    assert taken["holder"] == "train_dag/next"
    assert "took over slice lease 0 of train_dag/long: past its expiry" in capsys.readouterr().out
