"""Deterministic names for everything a DAG run creates.

A retried or restarted task must find what its earlier try created, so names derive
from (dag id, run id, task id, map index) and never from the try number.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuflow.errors import UserInputError

_DNS_INVALID = re.compile(r"[^a-z0-9-]+")
NODE_POOL_NAME_MAX = 40
_DNS_LABEL_RE = re.compile(r"^[a-z](?:[-a-z0-9]*[a-z0-9])?$")
_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_PROJECT_RE = re.compile(r"^([a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_CLUSTER_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
_NODE_POOL_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")


def run_key(dag_id: str, run_id: str, task_id: str = "", map_index: int = -1) -> str:
    """A short stable digest of the task instance's identity (without the try number)."""
    raw = "\x1f".join((dag_id, run_id, task_id, str(map_index)))
    return hashlib.sha256(raw.encode()).hexdigest()[:10]


OWNER_DIGEST_LEN = 32  # hex characters of an owner digest: fits a label value (63) with room to spare
_RECORD_FIELDS = ("dag_id", "run_id", "task_id", "map_index")


def owner_run_digest(dag_id: str, run_id: str) -> str:
    """A digest of one DAG run (exact ids, nothing shortened or sanitised): a valid Kubernetes and GCE
    label value, so a resource can carry its run where only labels fit (node pools, label selectors)."""
    raw = "\x1f".join(("run", dag_id, run_id))
    return hashlib.sha256(raw.encode()).hexdigest()[:OWNER_DIGEST_LEN]


def owner_dag_digest(dag_id: str) -> str:
    """A digest of one exact DAG id, as owner_run_digest: ``team.a`` and ``team_a`` never share one."""
    raw = "\x1f".join(("dag", dag_id))
    return hashlib.sha256(raw.encode()).hexdigest()[:OWNER_DIGEST_LEN]


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

    @classmethod
    def from_record(cls, record: object) -> TaskIdentity | None:
        """The identity ``record()`` wrote (a mapping, or its JSON text); None when it is not one (absent,
        not JSON, a field missing or of the wrong type): an owner that cannot be read."""
        if isinstance(record, (str, bytes)):
            try:
                record = json.loads(record)
            except ValueError:
                return None
        if not isinstance(record, Mapping) or set(record) != set(_RECORD_FIELDS):
            return None
        dag_id, run_id, task_id, map_index = (record[name] for name in _RECORD_FIELDS)
        if not all(isinstance(text, str) and text for text in (dag_id, run_id, task_id)):
            return None
        if isinstance(map_index, bool) or not isinstance(map_index, int) or map_index < -1:
            return None
        return cls(dag_id, run_id, task_id, map_index)

    def record(self) -> dict[str, Any]:
        """The full owner, recorded once where a resource lives (an annotation, a local cluster's state)."""
        return {"dag_id": self.dag_id, "run_id": self.run_id, "task_id": self.task_id, "map_index": self.map_index}

    @property
    def run_digest(self) -> str:
        return owner_run_digest(self.dag_id, self.run_id)

    @property
    def dag_digest(self) -> str:
        return owner_dag_digest(self.dag_id)

    @property
    def key(self) -> str:
        return run_key(self.dag_id, self.run_id, self.task_id, self.map_index)

    @property
    def submission_id(self) -> str:
        return submission_id(self.dag_id, self.run_id, self.task_id, self.map_index)

    def dns_name(self, *parts: str, max_len: int = 40) -> str:
        return dns_name(*parts, key=self.key, max_len=max_len)


def check_dns_label(field: str, name: object, *, max_len: int = 63) -> str:
    """A name of the dns_name() form (local clusters, Kubernetes objects): lowercase letters, digits and
    '-', starting with a letter, ending alphanumeric, at most max_len characters."""
    if not isinstance(name, str) or len(name) > max_len or not _DNS_LABEL_RE.match(name):
        raise UserInputError(
            field,
            name,
            f"use at most {max_len} lowercase letters, digits and '-', starting with a letter and ending with a "
            "letter or digit",
        )
    return name


# --- Google Cloud names: one rule each, cheap to load (operators check static names at parse time) ---
def check_project(project_id: str) -> str:
    if not isinstance(project_id, str) or not _PROJECT_RE.match(project_id):
        raise UserInputError(
            "project_id",
            project_id,
            "a project ID is 6-30 lowercase letters, digits or hyphens, starting with a "
            "letter (the ID, not the project name or number)",
        )
    return project_id


def is_zone(location: str) -> bool:
    return bool(_ZONE_RE.match(location or ""))


def check_cluster_location(location: str) -> str:
    """The cluster's location: a zone (zonal cluster) or a region (regional cluster)."""
    if not isinstance(location, str) or not (_ZONE_RE.match(location) or _REGION_RE.match(location)):
        raise UserInputError(
            "location",
            location,
            "give the cluster's zone like us-east5-b (or its region like us-east5 together with node_zone)",
        )
    return location


def check_cluster_name(cluster_name: str) -> str:
    if not isinstance(cluster_name, str) or not _CLUSTER_RE.match(cluster_name):
        raise UserInputError(
            "cluster_name",
            cluster_name,
            "a GKE cluster name is at most 40 lowercase letters, digits or hyphens, "
            "starts with a letter and ends with a letter or digit",
        )
    return cluster_name


def check_node_pool_name(name: str, field_name: str = "node_pool_name") -> str:
    if not isinstance(name, str) or not _NODE_POOL_RE.match(name):
        raise UserInputError(
            field_name,
            name,
            f"a node pool name is at most {NODE_POOL_NAME_MAX} lowercase letters, digits or hyphens, "
            "starts with a letter and ends with a letter or digit",
        )
    return name
