"""What names a Kubernetes object a task instance makes, and records its owner: the deterministic name (the
same on every try), the ownership labels (exact digests) and the annotation with the full owner record
that the orphan reaper judges by. Cheap to import (no Airflow, no clients)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from tpuflow.kubernetes.values import check_name
from tpuflow.labels import kubernetes_ownership_annotations, kubernetes_ownership_labels
from tpuflow.naming import TaskIdentity, dns_name, run_key
from tpuflow.validation import check_rendered_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context


def check_expires_after(value: object) -> float | None:
    """``expires_after`` in seconds: positive and finite, or None (no ``tpuflow-expires`` label)."""
    return check_rendered_seconds("expires_after", value)


def resource_name(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The object's name for one task instance: the same on every try."""
    return dns_name(dag_id, task_id, key=run_key(dag_id, run_id, task_id, map_index))


def ownership_labels(
    dag_id: str, run_id: str, task_id: str, map_index: int = -1, expires_at: int | None = None
) -> dict[str, str]:
    """The Kubernetes ownership labels of one task instance (tpuflow.labels.kubernetes_ownership_labels),
    with ``expires_at`` (unix time) its ``tpuflow-expires`` label too."""
    return kubernetes_ownership_labels(TaskIdentity(dag_id, run_id, task_id, map_index), expires_at)


def ownership_annotations(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, str]:
    """The annotation recording the task instance's full owner record (what the orphan reaper judges by)."""
    return kubernetes_ownership_annotations(TaskIdentity(dag_id, run_id, task_id, map_index))


def object_name(context: Context, explicit: str | None, task_id: str | None = None) -> str:
    """The object's name: the explicit one (checked), else the task instance's deterministic name."""
    if explicit:
        return check_name("name", explicit)
    who = TaskIdentity.from_context(context, task_id)
    return resource_name(who.dag_id, who.run_id, who.task_id, who.map_index)


def owner_annotations(context: Context) -> dict[str, str]:
    """The task instance's full owner record (dag, run, task, map index) as the object's annotation."""
    who = TaskIdentity.from_context(context)
    return ownership_annotations(who.dag_id, who.run_id, who.task_id, who.map_index)


def owner_labels(
    context: Context, extra: Mapping[str, str] | None, expires_after: timedelta | float | None = None
) -> dict[str, str]:
    """``extra`` plus the task instance's ownership labels; with ``expires_after`` (from now) the
    ``tpuflow-expires`` label too, so the reaper takes the object past it whatever its run's state."""
    who = TaskIdentity.from_context(context)
    seconds = check_expires_after(expires_after)
    expires_at = None if seconds is None else int(time.time() + seconds)
    owned = ownership_labels(who.dag_id, who.run_id, who.task_id, who.map_index, expires_at)
    return {**dict(extra or {}), **owned}
