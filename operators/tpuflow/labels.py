"""Labels: the keys tpuflow puts on what it creates, and the one set of rules label keys and values obey.

Two label systems, each with one rule set here:

- Kubernetes labels (RayCluster/RayService metadata, Ray pods, GKE node labels and taints): a key is
  an optional DNS-1123 subdomain prefix (at most 253 characters) and ``/``, then a name of at most 63
  characters ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``; a value is empty or at most 63 characters
  of the same form.
- GCE labels (``resourceLabels`` on a node pool's VMs): keys and values are at most 63 characters of
  ``[a-z0-9_-]``, and a key starts with a lowercase letter.

Ownership labels (who created an object, from ``tpuflow.naming.TaskIdentity``) come in both forms,
built here. Pure module (no Kubernetes or google imports).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from tpuflow.errors import UserInputError
from tpuflow.naming import TaskIdentity

# --- Kubernetes label and annotation keys --------------------------------------------------------------
LABEL_PREFIX = "tpuflow.dev"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "tpuflow"
# the task instance that created an object (what on_kill checks before deleting)
RUN_KEY_LABEL = f"{LABEL_PREFIX}/run-key"
DAG_ID_LABEL = f"{LABEL_PREFIX}/dag-id"
TASK_ID_LABEL = f"{LABEL_PREFIX}/task-id"
SPEC_HASH_ANNOTATION = f"{LABEL_PREFIX}/spec-hash"
# on a RayService: the hash of its rayClusterConfig (a changed shape needs a new cluster)
CLUSTER_SPEC_HASH_ANNOTATION = f"{LABEL_PREFIX}/cluster-spec-hash"
SLICE_ANNOTATION = f"{LABEL_PREFIX}/slice"
# the exact owner, read by the orphan reaper: the run's and the DAG's digests (tpuflow.naming.owner_run_digest,
# owner_dag_digest; label values, so selectable) and the full record (JSON of TaskIdentity.record())
OWNER_RUN_LABEL = f"{LABEL_PREFIX}/owner-run"
OWNER_DAG_LABEL = f"{LABEL_PREFIX}/owner-dag"
OWNER_ANNOTATION = f"{LABEL_PREFIX}/owner"

# --- GCE label keys (a node pool's VMs) ----------------------------------------------------------------
GCE_MANAGED_LABEL = "tpuflow-managed"
GCE_DAG_LABEL = "tpuflow-dag"
GCE_RUN_LABEL = "tpuflow-run"
GCE_TASK_LABEL = "tpuflow-task"
# the exact identity (a digest of dag, run, task and map index); the readable labels may be cut short
OWNER_KEY_LABEL = "tpuflow-key"
# the exact run and DAG (digests of the full ids, as OWNER_RUN_LABEL / OWNER_DAG_LABEL): what the reaper judges a
# pool by; GCE has no annotations, so a pool carries no full record
GCE_OWNER_RUN_LABEL = "tpuflow-owner-run"
GCE_OWNER_DAG_LABEL = "tpuflow-owner-dag"
# until when (unix seconds) a resource is wanted, whatever its run's state: on a node pool's VMs, and (a valid
# Kubernetes label key too) on RayClusters and RayServices; the reaper takes what is past it
EXPIRES_LABEL = "tpuflow-expires"
# the operators' default ``expires_after``: node pools, RayClusters, RayServices, local clusters
DEFAULT_EXPIRES_AFTER = timedelta(hours=24)
# on what a ``keep_endpoint`` teardown left running on purpose (the RayService, its ProvisioningRequest, the serve
# node pool's VMs; a valid GCE and Kubernetes label key, as EXPIRES_LABEL, which the mark replaces): the reaper
# never takes it, whatever its run's state. A local cluster records ``kept`` in its state instead.
KEPT_LABEL = "tpuflow-kept"
KEPT_VALUE = "true"

MAX_NAME = 63
MAX_PREFIX = 253
_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")
_GCE_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_GCE_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_GCE_INVALID = re.compile(r"[^a-z0-9_-]")

KEY_RULE = (
    "a label key is [prefix/]name: name at most 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric; "
    "prefix a DNS subdomain (lowercase, dots) of at most 253 characters"
)
VALUE_RULE = "a label value is empty or at most 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric"


# --- Kubernetes rules ----------------------------------------------------------------------------------
def is_label_name(text: str) -> bool:
    """A label name, or a non-empty label value: at most 63 characters, alphanumeric at both ends."""
    return len(text) <= MAX_NAME and bool(_NAME_RE.match(text))


def is_label_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= MAX_PREFIX and _DNS1123_SUBDOMAIN_RE.match(prefix)):
        return False
    return is_label_name(name)


def check_label_key(field: str, key: object) -> str:
    if not is_label_key(key):
        raise UserInputError(field, key, KEY_RULE)
    return key  # type: ignore[return-value]


def check_label_value(field: str, value: object, key: str = "") -> str:
    """The value as Kubernetes takes it (a string). None is the empty value; numbers are written out."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UserInputError(field, value, f"{VALUE_RULE}; give it as a string" + (f" (key {key!r})" if key else ""))
    text = str(value)
    if text and not is_label_name(text):
        raise UserInputError(field, value, VALUE_RULE + (f" (key {key!r})" if key else ""))
    return text


def check_labels(field: str, labels: Mapping[str, Any] | None) -> dict[str, str]:
    """Kubernetes labels (metadata, pod templates, node labels) checked and normalised to strings."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise UserInputError(field, labels, "give a mapping of label key to value")
    return {check_label_key(field, key): check_label_value(field, value, key) for key, value in labels.items()}


def label_safe(text: str) -> str:
    """A label value derived from free text (a dag or task id): invalid runs become '-', at most 63
    characters, alphanumeric at both ends (possibly empty)."""
    cut = _NAME_INVALID.sub("-", str(text))[:MAX_NAME]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cut)


# --- GCE rules -----------------------------------------------------------------------------------------
def gce_label_value(text: object) -> str:
    """A GCE label value derived from free text: lowercase, [a-z0-9_-] only, at most 63 characters."""
    return _GCE_INVALID.sub("_", str(text).lower())[:MAX_NAME]


def check_gce_labels(field: str, labels: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not _GCE_KEY_RE.match(key):
            raise UserInputError(field, key, "a GCE label key is at most 63 of a-z 0-9 _ -, starting with a letter")
        if not isinstance(value, str) or not _GCE_VALUE_RE.match(value):
            raise UserInputError(field, value, f"a GCE label value (key {key!r}) is at most 63 of a-z 0-9 _ -")
        out[key] = value
    return out


# --- ownership ------------------------------------------------------------------------------------------
def kubernetes_ownership_labels(identity: TaskIdentity, expires_at: int | None = None) -> dict[str, str]:
    """Kubernetes labels naming the task instance that created an object; RUN_KEY_LABEL, OWNER_RUN_LABEL and
    OWNER_DAG_LABEL are exact (digests), the readable ones may be cut short. With ``expires_at`` (unix time)
    also EXPIRES_LABEL, as on a node pool's VMs. The full owner goes in kubernetes_ownership_annotations."""
    labels = {
        MANAGED_BY: MANAGED_BY_VALUE,
        DAG_ID_LABEL: label_safe(identity.dag_id),
        TASK_ID_LABEL: label_safe(identity.task_id),
        RUN_KEY_LABEL: identity.key,
        OWNER_RUN_LABEL: identity.run_digest,
        OWNER_DAG_LABEL: identity.dag_digest,
    }
    return _with_expiry(labels, expires_at)


def kubernetes_ownership_annotations(identity: TaskIdentity) -> dict[str, str]:
    """The annotation recording an object's full owner (dag, run, task, map index): what the reaper reads."""
    return {OWNER_ANNOTATION: owner_record_text(identity)}


def owner_record_text(identity: TaskIdentity) -> str:
    """The owner record as text (compact JSON, keys sorted): the same bytes on every try."""
    return json.dumps(identity.record(), sort_keys=True, separators=(",", ":"))


def gce_ownership_labels(identity: TaskIdentity, expires_at: int | None) -> dict[str, str]:
    """GCE labels on a node pool's VMs: who created it and until when (unix time; None: no expiry, judged by its
    run alone) it is wanted, so an orphan can be found and billed. OWNER_KEY_LABEL, GCE_OWNER_RUN_LABEL and
    GCE_OWNER_DAG_LABEL are exact (digests); the readable ones may be cut short."""
    labels = {
        GCE_MANAGED_LABEL: "true",
        GCE_DAG_LABEL: gce_label_value(identity.dag_id),
        GCE_RUN_LABEL: gce_label_value(identity.run_id),
        GCE_TASK_LABEL: gce_label_value(identity.task_id),
        OWNER_KEY_LABEL: identity.key,
        GCE_OWNER_RUN_LABEL: identity.run_digest,
        GCE_OWNER_DAG_LABEL: identity.dag_digest,
    }
    return check_gce_labels("resource_labels", _with_expiry(labels, expires_at))


def _with_expiry(labels: dict[str, str], expires_at: int | None) -> dict[str, str]:
    if expires_at is not None:
        labels[EXPIRES_LABEL] = str(int(expires_at))
    return labels


def is_kept(labels: Mapping[str, str] | None) -> bool:
    """Whether labels (Kubernetes or GCE) carry the kept mark a ``keep_endpoint`` teardown sets."""
    return (labels or {}).get(KEPT_LABEL) == KEPT_VALUE


def kept_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """``labels`` marked kept: KEPT_LABEL added, EXPIRES_LABEL gone (a kept resource has no expiry)."""
    out = {k: v for k, v in (labels or {}).items() if k != EXPIRES_LABEL}
    out[KEPT_LABEL] = KEPT_VALUE
    return out


def kept_metadata_patch() -> dict[str, Any]:
    """A merge patch (RFC 7386: null removes a key) that marks a Kubernetes object kept, as kept_labels does."""
    return {"metadata": {"labels": {KEPT_LABEL: KEPT_VALUE, EXPIRES_LABEL: None}}}
