"""Running a deferred task's trigger the way Airflow's triggerer does: rebuilt from its serialized kwargs,
given the task instance, its XComs stored through the Task SDK's XCom class (here into a dict)."""

from __future__ import annotations

import asyncio
import importlib
import json
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred


def rebuilt(deferred: TaskDeferred) -> Any:
    """The deferred trigger as the triggerer builds it: from its serialized, plain-JSON kwargs."""
    classpath, kwargs = deferred.trigger.serialize()
    module, _, cls = classpath.rpartition(".")
    return getattr(importlib.import_module(module), cls)(**json.loads(json.dumps(kwargs)))


def first_event(trigger: Any, task_id: str = "t") -> tuple[Any, dict[str, Any]]:
    """The trigger's event, and the XComs it stored (key -> value) for its task instance."""
    from airflow.sdk.execution_time.xcom import XCom

    trigger.task_instance = SimpleNamespace(dag_id="d", run_id="r", task_id=task_id, map_index=-1)
    stored: dict[str, Any] = {}

    async def aset(key: str, value: Any, **where: Any) -> None:
        stored[key] = value

    async def aget_one(**where: Any) -> Any:
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(XCom, "aset", staticmethod(aset))
        patch.setattr(XCom, "aget_one", staticmethod(aget_one))
        event = asyncio.run(anext(trigger.run()))
    return event, stored
