"""Deterministic names for everything a DAG run creates.

A retried or restarted task must find what its earlier try created, so names derive
from (dag id, run id, task id, map index) and never from the try number.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_DNS_INVALID = re.compile(r"[^a-z0-9-]+")


def run_key(dag_id: str, run_id: str, task_id: str = "", map_index: int = -1) -> str:
    """A short stable digest of the task instance's identity (without the try number)."""
    raw = "\x1f".join((dag_id, run_id, task_id, str(map_index)))
    return hashlib.sha256(raw.encode()).hexdigest()[:10]


def dns_name(*parts: str, key: str, max_len: int = 40) -> str:
    """An RFC 1035 label (GKE node pools, Kubernetes objects): lowercase, starts with a letter,
    ends alphanumeric, at most max_len characters, unique through the digest `key`."""
    readable = _DNS_INVALID.sub("-", "-".join(p.lower() for p in parts if p)).strip("-")
    readable = re.sub(r"-{2,}", "-", readable)
    if not readable or not readable[0].isalpha():
        readable = f"tf-{readable}".rstrip("-")
    room = max_len - len(key) - 1
    readable = readable[:room].rstrip("-")
    return f"{readable}-{key}"


def submission_id(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """Ray job submission id for one task instance (same on every try)."""
    safe_task = re.sub(r"[^A-Za-z0-9_.-]+", "-", task_id)[:40]
    return f"tpuflow-{safe_task}-{run_key(dag_id, run_id, task_id, map_index)}"


@dataclass(frozen=True)
class TaskIdentity:
    """Who creates a resource: one task instance, without its try number. Every deterministic name,
    submission id and ownership label derives from it, so a retry finds what an earlier try made and
    two mapped instances of one task never share a resource."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1

    @classmethod
    def from_context(cls, context: Mapping[str, Any], task_id: str | None = None) -> TaskIdentity:
        """The running task instance (or, with ``task_id``, another task of the same run and map index)."""
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return cls(ti.dag_id, ti.run_id, task_id or ti.task_id, -1 if map_index is None else int(map_index))

    @property
    def key(self) -> str:
        return run_key(self.dag_id, self.run_id, self.task_id, self.map_index)

    @property
    def submission_id(self) -> str:
        return submission_id(self.dag_id, self.run_id, self.task_id, self.map_index)

    def dns_name(self, *parts: str, max_len: int = 40) -> str:
        return dns_name(*parts, key=self.key, max_len=max_len)
