"""The waits look again soon at first, then every poll_interval: a RayCluster gone or ready after a few seconds,
a GKE operation done quickly, queued capacity or a Serve deploy that is there at once, ends its wait within
seconds instead of a whole interval (the delays each wait
slept are recorded, not timed)."""

from __future__ import annotations

import asyncio
import itertools
import time
from types import SimpleNamespace
from typing import Any

import pytest
from google.cloud.container_v1.types import Operation
from support.kuberay_readers import READY, WAITING, NothingToExplain

from tpuflow.gke.waits import wait_for_operation
from tpuflow.kuberay.waits import wait_gone, wait_ready
from tpuflow.polling import poll_delays


def test_the_delays_double_from_one_second_up_to_the_interval() -> None:
    assert list(itertools.islice(poll_delays(10), 7)) == [1, 2, 4, 8, 10, 10, 10]
    assert list(itertools.islice(poll_delays(0.5), 3)) == [0.5, 0.5, 0.5]  # a short interval is kept as it is


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every delay the waits ask asyncio.sleep for (returning at once)."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def record(delay: float, *args: Any) -> None:
        delays.append(round(delay, 3))
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", record)
    return delays


class Sequence(NothingToExplain):
    def __init__(self, *objects: Any) -> None:
        self.objects, self.calls = list(objects), 0

    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.calls += 1
        return self.objects[min(self.calls, len(self.objects)) - 1]  # type: ignore[no-any-return]


TERMINATING = {"metadata": {"name": "rc", "deletionTimestamp": "2026-12-07T00:00:00Z"}}


def test_a_raycluster_gone_on_the_third_look_is_waited_for_three_seconds_not_twenty(slept: list[float]) -> None:
    args = {"kind": "RayCluster", "name": "rc", "namespace": "ns", "deadline": time.time() + 600, "poll_interval": 10}
    event = asyncio.run(wait_gone(Sequence(TERMINATING, TERMINATING, None), **args))
    assert event["status"] == "success" and slept == [1, 2]


def test_the_ready_wait_ramps_to_its_interval(slept: list[float]) -> None:
    args = {"kind": "RayCluster", "name": "rc", "namespace": "ns", "deadline": time.time() + 600, "poll_interval": 10}
    event = asyncio.run(wait_ready(Sequence(*[WAITING] * 6, READY), **args))
    assert event["status"] == "success" and slept == [1, 2, 4, 8, 10, 10]


def test_a_gke_operation_is_looked_at_soon_then_every_interval(slept: list[float]) -> None:
    states = iter([Operation.Status.RUNNING] * 5 + [Operation.Status.DONE])

    async def get_operation() -> Any:
        return SimpleNamespace(status=next(states), name="op", start_time="", operation_type=None, target_link="")

    log = SimpleNamespace(debug=lambda *a: None, exception=lambda *a: None)
    event = asyncio.run(wait_for_operation(get_operation, "op", poll_interval=10, log=log))
    assert event["status"] == "success" and slept == [1, 2, 4, 8, 10]


def test_queued_capacity_that_arrives_soon_is_seen_soon(slept: list[float]) -> None:
    from tpuflow.capacity.triggers import wait_provisioned

    waiting = {"status": {"conditions": [{"type": "Accepted", "status": "True"}]}}
    provisioned = {"status": {"conditions": [{"type": "Provisioned", "status": "True", "reason": "Provisioned"}]}}
    answers = iter([waiting, waiting, waiting, provisioned])

    class Requests:
        async def get_provisioning_request(self, name: str, namespace: str) -> dict[str, Any]:
            return next(answers)

    log = SimpleNamespace(info=lambda *a: None)
    event = asyncio.run(
        wait_provisioned(Requests(), name="pr", namespace="ns", deadline=time.time() + 600, poll_interval=30,
                         started_at=time.time(), log=log)  # type: ignore[arg-type]
    )  # fmt: skip
    assert event["status"] == "success" and slept == [1, 2, 4]


def test_the_reapers_gke_operation_wait_looks_soon_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GKE hook's wait in a worker's own thread (the reaper's pool delete): the same delays, slept with time.sleep."""
    from tpuflow.gke import hooks

    states = iter([Operation.Status.RUNNING] * 4 + [Operation.Status.DONE])
    slept: list[float] = []
    monkeypatch.setattr(hooks.time, "sleep", slept.append)
    hook = SimpleNamespace(
        get_operation=lambda name, project_id: SimpleNamespace(status=next(states), name=name),
        raise_for_operation_error=lambda operation: operation,
    )
    done = hooks.GKENodePoolHook.wait_for_node_pool_operation(hook, "op", project_id="p", poll_interval=5)  # type: ignore[arg-type]
    assert done.name == "op" and slept == [1, 2, 4, 5]
