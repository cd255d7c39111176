"""The base of every tpuflow trigger: plain-JSON kwargs serialised under the trigger's classpath.

Triggers live in the installed package (the triggerer imports them by classpath, never from the
DAGs folder). A subclass lists the constructor arguments it serialises in ``serialize_fields``;
they must be plain JSON values (deadlines as epoch seconds, targets as dicts). Each trigger runs
one wait coroutine and fires one event of the shape in ``tpuflow.events``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger


class TpuflowTrigger(BaseTrigger):
    serialize_fields: ClassVar[tuple[str, ...]] = ()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {name: getattr(self, name) for name in self.serialize_fields},
        )
