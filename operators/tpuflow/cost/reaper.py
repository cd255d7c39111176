"""The orphan reaper: find what tpuflow created whose run no longer needs it, and delete it.

Every resource a run creates records its full owner (dag id, run id, task id, map index:
tpuflow.naming.TaskIdentity.record()) once where it lives, and every judgement reads that record, never a name
rebuilt from ids or a label value two ids may share. A resource tpuflow made whose owner cannot be read (no
record, a malformed one) is never deleted, only reported (``Orphans.unreadable``; reap() says so); a resource
without the ownership marks is never touched:

- GKE node pools (``tpuflow-managed=true``): an orphan when past its ``tpuflow-expires`` label, or when its
  ``tpuflow-owner-run`` label (a digest of the exact dag and run ids; GCE has no annotations) is no running
  run's digest, whatever its DAG. A pool still being created is waited for, then deleted (GKE refuses the
  delete before).
- workload policies tpuflow made (their description names ``tpuflow-key``, ``tpuflow-owner-run`` and
  ``tpuflow-owner-dag``): an orphan when no live pool uses it and its run is not running.
- RayClusters and RayServices (``app.kubernetes.io/managed-by=tpuflow``): an orphan when past its
  ``tpuflow-expires`` label, or when the run of its ``tpuflow.dev/owner`` annotation (the full record; without
  it, the ``tpuflow.dev/owner-run`` digest label) is not running, whatever task (mapped or not) made it.
- local Ray clusters (state under tpuflow.local.cluster.default_base_dir()): an orphan when the run its
  state.json's ``owner`` record names is not running, when its processes are gone, or when past the
  ``expires_at`` its state records (the create operator's ``expires_after``). A cluster with neither an owner
  record nor a run's name (``tpuflow local up``) is not a run's and never looked at.
- slice leases: a lease whose holder run (its exact dag and run) is not running is given back; a gs:// lease
  past its expiry whose run is still running is renewed, never given back (a training may outlive the expiry).
- by liveness (tpuflow.liveness): a run's local cluster or lease whose supervising process (`tpuflow demo`,
  `airflow dags test`) is provably dead, or a lease past its expiry whose run is not known to be running, is an
  orphan whatever its run state and age (every lease file present is looked at).

Kept endpoints are never taken. A ``keep_endpoint`` run whose endpoint answered leaves it running on purpose,
and its teardowns mark what they keep: the RayService (the RayCluster it owns goes with it), its
ProvisioningRequest and PodTemplates, and the serve node pool's VMs get the ``tpuflow-kept=true`` label
(tpuflow.labels.KEPT_LABEL) in place of their ``tpuflow-expires``; a local cluster records ``"kept": true`` in
its state.json. Whatever its run's state or expiry, a marked resource is no orphan (a kept local cluster whose
processes are gone still is: nothing is left to keep). Each reaper run, dry or not, says how many it skipped:
they are still running, and billed. Delete a kept endpoint yourself when you are done with it::

    kubectl get rayservices,provisioningrequests,podtemplates -l tpuflow-kept=true   # what is kept
    kubectl delete rayservice NAME                  # its RayCluster goes with it
    kubectl delete provisioningrequest,podtemplate -l tpuflow-kept=true             # every kept request
    gcloud container node-pools list --cluster=C --location=L --format="yaml(name,config.resourceLabels)"
    gcloud container node-pools delete POOL --cluster=C --location=L                 # a pool labelled kept
    tpuflow local down --name NAME                  # a kept local cluster (`tpuflow local status` says kept)

(or remove the mark, ``kubectl label rayservice NAME tpuflow-kept-``, and let the next reaper run take it once
its run is over).

"Not running" is only said of the DAGs the run states cover (RunStates.dag_ids; the metadata DB covers
every DAG, the reaper task only its ``dag_ids``, compared with the owner's exact DAG id or its
``owner-dag`` digest, never a name prefix): a resource of another DAG is never an orphan by its
run state, only past its ``tpuflow-expires`` label (or a local cluster's ``expires_at``) or with its Ray
processes gone (local).

Only resources older than ``older_than`` seconds are taken (a run that just started may not be in
the list of running runs yet). A failed list stops the reaper before it deletes anything.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from tpuflow.cost.ledger import build_ledger, pool_span, rfc3339_to_unix, slice_entry
from tpuflow.errors import UserInputError
from tpuflow.gke.workload_policy import owner_digests_of, owner_of, region_of
from tpuflow.kuberay import GROUP, RAYCLUSTERS, RAYSERVICES, VERSION
from tpuflow.kuberay.kinds import KIND_BY_PLURAL
from tpuflow.labels import (
    DAG_ID_LABEL,
    EXPIRES_LABEL,
    GCE_DAG_LABEL,
    GCE_MANAGED_LABEL,
    GCE_OWNER_DAG_LABEL,
    GCE_OWNER_RUN_LABEL,
    GCE_RUN_LABEL,
    GCE_TASK_LABEL,
    KEPT_LABEL,
    MANAGED_BY,
    MANAGED_BY_VALUE,
    OWNER_ANNOTATION,
    OWNER_DAG_LABEL,
    OWNER_RUN_LABEL,
    is_kept,
)
from tpuflow.liveness import dead_reason
from tpuflow.naming import OWNER_DIGEST_LEN, TaskIdentity, owner_dag_digest, owner_run_digest
from tpuflow.slices.operators import run_is_over
from tpuflow.slices.supervision import SupervisionStore, dead_runs
from tpuflow.storage import read_text, write_text
from tpuflow.tpu.generations import GENERATIONS

log = logging.getLogger(__name__)

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, field_name: str = "--older-than") -> float:
    """``90s``, ``15m``, ``2h``, ``1d`` as seconds."""
    match = _DURATION_RE.match(str(text))
    if not match:
        raise UserInputError(field_name, text, "give a number and a unit s, m, h or d, e.g. 2h or 30m")
    return float(match.group(1)) * _UNITS[match.group(2)]


class ReaperListError(RuntimeError):
    """A list call failed: the reaper deletes nothing on an incomplete picture."""


def _first_line(err: Exception) -> str:
    """The error's first line (SQL and HTTP errors carry pages of detail after it)."""
    text = str(err).strip()
    return (text.splitlines() or [type(err).__name__])[0]


class RunStates(Protocol):
    @property
    def dag_ids(self) -> Collection[str] | None:
        """The DAGs running() answers for (None: every DAG). Another DAG's runs are unknown, not finished."""
        ...

    def running(self) -> dict[str, list[str]]:
        """dag_id -> run ids of its running (and queued) runs."""
        ...


def _covers(covered: Collection[str] | None, dag_id: str | None) -> bool:
    """Whether the exact DAG id ``dag_id`` is a covered DAG's; None covers every DAG. An owner that is not
    covered is kept whatever running() says."""
    return covered is None or (dag_id is not None and dag_id in covered)


def _covers_digest(covered: Collection[str] | None, dag_digest: str) -> bool:
    """_covers for a resource that carries only its DAG's digest (tpuflow.naming.owner_dag_digest)."""

    return covered is None or any(owner_dag_digest(dag) == dag_digest for dag in covered)


def _running_digests(running: Mapping[str, list[str]]) -> set[str]:
    """The owner-run digests (tpuflow.naming.owner_run_digest) of every running run, whatever its DAG."""

    return {owner_run_digest(dag, run) for dag, runs in running.items() for run in runs}


def _is_digest(value: object) -> bool:

    return isinstance(value, str) and len(value) == OWNER_DIGEST_LEN and all(c in "0123456789abcdef" for c in value)


class OwnerUnreadable(str):
    """A decision's answer for a resource tpuflow made whose owner cannot be read (no owner record, or a
    malformed one): never deleted, only reported (collect_orphans' ``unreadable``)."""


def _unreadable(what: str) -> OwnerUnreadable:
    return OwnerUnreadable(f"owner unreadable: {what}; left alone (delete it yourself if no run needs it)")


@dataclass
class Orphan:
    kind: str  # node_pool | workload_policy | raycluster | rayservice | local_cluster | lease
    name: str
    where: str
    reason: str
    delete: Callable[[], Any] = field(repr=False, default=lambda: None)
    # the owner run's digest (tpuflow.naming.owner_run_digest) where it is known
    run: str | None = None
    # a node pool's bill (chips, generation, created_at): what the reaper's ledger entry books
    bill: dict[str, Any] | None = field(repr=False, default=None)

    def line(self) -> str:
        return f"{self.kind} {self.name} ({self.where}): {self.reason}"


class Orphans(list[Orphan]):
    """collect_orphans' answer: the orphans; in ``kept`` the resources the kept mark spared, and in ``unreadable``
    the resources tpuflow made whose owner cannot be read (Orphan records that are never deleted), so a reaper
    run can say what is still running, and billed."""

    def __init__(self, orphans: Iterable[Orphan] = (), kept: Iterable[Orphan] = (),
                 unreadable: Iterable[Orphan] = ()) -> None:  # fmt: skip
        super().__init__(orphans)
        self.kept: list[Orphan] = list(kept)
        self.unreadable: list[Orphan] = list(unreadable)
        # leases past their expiry whose run is still running: renewed by reap() (their ``delete`` renews)
        self.renew: list[Orphan] = []
        # the runs whose recorded supervisor is provably dead (digest -> (record, why)), and where they are recorded
        self.dead_runs: dict[str, Any] = {}
        self.supervision: Any = None


class SupervisorGone(str):
    """A decision's answer for a resource whose run's recorded supervisor (tpuflow.slices.supervision) is
    provably dead: an orphan whatever the metadata DB says and whatever its age (proof, not a guess)."""


def _supervisor_gone(run_digest: object, dead: Mapping[str, str] | None) -> SupervisorGone | None:
    """Why the run ``run_digest`` names is over by its supervising process; None: not known to be."""
    if not dead or not isinstance(run_digest, str) or run_digest not in dead:
        return None
    return SupervisorGone(f"the process that supervised its run is gone ({dead[run_digest]})")


def _kept_reason() -> str:

    return f"kept by its run's keep_endpoint ({KEPT_LABEL}): still running, and billed"


# --- deciding ---------------------------------------------------------------------------------------------
def expiry_reason(expires: object, now: float, what: str = "label") -> str | None:
    """Why a resource is past its expiry (unix seconds: a label's digits, or a number); None: it is not,
    or it has none. Applies whatever its run's state, and to DAGs the run states do not cover."""

    if isinstance(expires, str):
        expires = int(expires) if expires.isdigit() else None
    if isinstance(expires, bool) or not isinstance(expires, (int, float)) or expires >= now:
        return None
    return f"past its {EXPIRES_LABEL} {what} ({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(expires))} UTC)"


def pool_orphan_reason(
    labels: Mapping[str, str],
    running: Mapping[str, list[str]],
    now: float,
    covered: Collection[str] | None = None,
    dead: Mapping[str, str] | None = None,
) -> str | None:
    """Why a node pool with these resourceLabels is an orphan; None: a running run owns it, its DAG is not
    ``covered`` (and it is not past its expiry), it is kept (keep_endpoint; whatever its run and expiry), or it
    is not ours; an OwnerUnreadable: ours, without a readable owner (never deleted). The owner is the exact run
    (the ``tpuflow-owner-run`` digest, compared with the digests of every DAG's running runs) and DAG
    (``tpuflow-owner-dag``, compared with the covered DAGs' digests), never a label value two ids may share."""

    if labels.get(GCE_MANAGED_LABEL) != "true" or is_kept(labels):
        return None
    run_digest, dag_digest = labels.get(GCE_OWNER_RUN_LABEL), labels.get(GCE_OWNER_DAG_LABEL)
    if not (_is_digest(run_digest) and _is_digest(dag_digest)):
        return _unreadable(f"no valid {GCE_OWNER_RUN_LABEL} and {GCE_OWNER_DAG_LABEL} labels")
    gone = _supervisor_gone(run_digest, dead)
    if gone is not None:
        return gone
    expired = expiry_reason(labels.get(EXPIRES_LABEL), now)
    if expired is not None:
        return expired
    if not _covers_digest(covered, str(dag_digest)):
        return None
    if run_digest in _running_digests(running):
        return None
    dag = labels.get(GCE_DAG_LABEL, "?")
    if not any(owner_dag_digest(d) == dag_digest for d, runs in running.items() if runs):
        return f"its DAG ({dag}) has no running run"
    return f"its run {dag}/{labels.get(GCE_RUN_LABEL, '?')} is not running (finished, or gone from the metadata DB)"


def kube_orphan_reason(
    labels: Mapping[str, str],
    running: Mapping[str, list[str]],
    covered: Collection[str] | None = None,
    now: float | None = None,
    annotations: Mapping[str, str] | None = None,
    dead: Mapping[str, str] | None = None,
) -> str | None:
    """Why a RayCluster/RayService with these labels and ``annotations`` is an orphan; None: a running run owns
    it, its DAG is not ``covered`` (and it is not past its expiry at ``now``, default the current time), it is
    kept (keep_endpoint; whatever its run and expiry), or it is not ours; an OwnerUnreadable: ours, without a
    readable owner (never deleted). The owner is the full record of the ``tpuflow.dev/owner`` annotation (exact
    dag and run, whatever the task or map index); without it, the ``tpuflow.dev/owner-run`` and ``owner-dag``
    digest labels."""

    if labels.get(MANAGED_BY) != MANAGED_BY_VALUE or is_kept(labels):
        return None
    run_digest, dag_digest = labels.get(OWNER_RUN_LABEL), labels.get(OWNER_DAG_LABEL)
    record = (annotations or {}).get(OWNER_ANNOTATION)
    owner = None if record is None else TaskIdentity.from_record(record)
    if record is not None and owner is None:
        return _unreadable(f"its {OWNER_ANNOTATION} annotation is not an owner record")
    if owner is not None and run_digest is not None and run_digest != owner.run_digest:
        return _unreadable(f"its {OWNER_ANNOTATION} annotation and {OWNER_RUN_LABEL} label disagree")
    if owner is None and not (_is_digest(run_digest) and _is_digest(dag_digest)):
        return _unreadable(
            f"no {OWNER_ANNOTATION} annotation and no valid {OWNER_RUN_LABEL} and {OWNER_DAG_LABEL} labels"
        )
    gone = _supervisor_gone(owner.run_digest if owner is not None else run_digest, dead)
    if gone is not None:
        return gone
    expired = expiry_reason(labels.get(EXPIRES_LABEL), time.time() if now is None else now)
    if expired is not None:
        return expired
    if owner is not None:
        if not _covers(covered, owner.dag_id) or owner.run_id in running.get(owner.dag_id, []):
            return None
        return f"no running run of DAG {owner.dag_id} made it (run {owner.run_id}, task {owner.task_id})"
    if not _covers_digest(covered, str(dag_digest)) or run_digest in _running_digests(running):
        return None
    return f"no running run of DAG {labels.get(DAG_ID_LABEL, '?')} made it ({OWNER_RUN_LABEL} {run_digest})"


def policy_orphan_reason(
    description: str | None,
    users: Iterable[str],
    orphan_pools: set[str],
    running: Mapping[str, list[str]],
    covered: Collection[str] | None = None,
    dead: Mapping[str, str] | None = None,
) -> str | None:
    """Why a workload policy is an orphan; None: tpuflow did not make it, a live pool uses it (a kept pool is
    never an orphan, so its policy stays with it), its run is running (the create task makes the policy before
    its pools) or its DAG is not ``covered``; an OwnerUnreadable: ours, its description naming no owner digests
    (never deleted)."""

    if owner_of(description) is None:
        return None
    users = sorted(users)
    if any(pool not in orphan_pools for pool in users):
        return None
    owner = owner_digests_of(description)
    if owner is None:
        return _unreadable("its description names no tpuflow-owner-run and tpuflow-owner-dag")
    run_digest, dag_digest = owner
    gone = _supervisor_gone(run_digest, dead)
    if gone is None and (not _covers_digest(covered, dag_digest) or run_digest in _running_digests(running)):
        return None
    run = gone or f"its run (tpuflow-owner-run {run_digest}) is not running"
    text = (
        f"{run}; used only by orphan node pools ({', '.join(users)}): deleted after them"
        if users
        else (f"{run} and no node pool uses it")
    )
    return SupervisorGone(text) if gone is not None else text


def _is_run_cluster(name: str, owner: object) -> bool:
    """Whether a local cluster is a run's (the reaper's to judge): one with an owner record, or named as the
    create operator names them (an owner record lost or never written: reported, never deleted). A cluster
    of `tpuflow local up` has neither."""
    return owner is not None or name.startswith("local-")


def local_orphan_reason(
    name: str,
    alive: bool,
    running: Mapping[str, list[str]],
    covered: Collection[str] | None = None,
    expires_at: float | None = None,
    now: float | None = None,
    kept: bool = False,
    owner: object = None,
) -> str | None:
    """Why a local cluster is an orphan; None: a running run started it, no run did (``tpuflow local up``),
    or (its processes alive) it is ``kept`` (keep_endpoint; whatever its run and expiry), or (not past
    ``expires_at`` at ``now``, default the current time) its DAG is not ``covered``; an OwnerUnreadable: a run's
    cluster whose ``owner`` record (its state.json's, TaskIdentity.record()) is missing or malformed (never
    deleted). The run is the record's exact dag and run, whatever task started it and its map index."""

    if not _is_run_cluster(name, owner):
        return None  # started by `tpuflow local up` or by hand: not a run's
    if alive and kept:
        return None
    identity = TaskIdentity.from_record(owner)
    if identity is None:
        return _unreadable(
            "its state.json has no owner record" if owner is None else "its state.json's owner is malformed"
        )
    if not alive:
        return "its Ray processes are gone (the run was killed; its state was left behind)"
    expired = expiry_reason(expires_at, time.time() if now is None else now, "time")
    if expired is not None:
        return expired
    if not _covers(covered, identity.dag_id) or identity.run_id in running.get(identity.dag_id, []):
        return None
    return f"no running run started it (run {identity.dag_id}/{identity.run_id})"


# --- finding ----------------------------------------------------------------------------------------------
def list_pools(hook: Any, project_id: str, cluster_name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cluster's node pools and the location's operations (REST JSON)."""
    from tpuflow.gke.hooks import to_rest_json

    try:
        pools = [to_rest_json(p) for p in hook.list_node_pools(project_id=project_id, cluster_name=cluster_name)]
        operations = [
            to_rest_json(o)
            for o in hook.get_cluster_manager_client()
            .list_operations(parent=f"projects/{project_id}/locations/{hook.location}")
            .operations
        ]
    except Exception as err:
        raise ReaperListError(f"listing node pools of cluster {cluster_name}: {_first_line(err)}") from err
    return pools, operations


def find_pool_orphans(hook: Any, project_id: str, cluster_name: str, pools: list[dict[str, Any]],
                      operations: list[dict[str, Any]], running: Mapping[str, list[str]], older_than: float,
                      now: float, wait_timeout: float = 1800.0, covered: Collection[str] | None = None,
                      kept: list[Orphan] | None = None, unreadable: list[Orphan] | None = None,
                      dead: Mapping[str, str] | None = None) -> list[Orphan]:  # fmt: skip
    """The orphan pools; the kept ones (ours, with the kept mark) are added to ``kept``, ours whose owner cannot
    be read to ``unreadable``. ``dead``: the runs (by digest) whose recorded supervisor is provably dead."""

    where = f"projects/{project_id}/locations/{hook.location}/clusters/{cluster_name}"
    found = []
    for pool in pools:
        labels = (pool.get("config") or {}).get("resourceLabels") or {}
        reason = pool_orphan_reason(labels, running, now, covered, dead)
        if isinstance(reason, OwnerUnreadable):
            _note(unreadable, Orphan("node_pool", pool["name"], where, reason))
            continue
        if reason is None:
            if kept is not None and labels.get(GCE_MANAGED_LABEL) == "true" and is_kept(labels):
                kept.append(Orphan("node_pool", pool["name"], where, _kept_reason()))
            continue
        created, _ = pool_span(operations, pool["name"])
        if created is not None and now - created < older_than and not isinstance(reason, SupervisorGone):
            continue
        if pool.get("status") in ("PROVISIONING", "RECONCILING"):
            reason += f"; still {pool.get('status')}: waits for that to finish, then deletes"

        def delete(name: str = pool["name"]) -> Any:
            return delete_pool(hook, project_id, cluster_name, name, wait_timeout)

        bill = pool_bill(pool, created)
        found.append(Orphan("node_pool", pool["name"], where, reason, delete, labels.get(GCE_OWNER_RUN_LABEL), bill))
    return found


def pool_bill(pool: Mapping[str, Any], created: float | None) -> dict[str, Any] | None:
    """What a TPU node pool bills: its chips (nodes x the machine type's ``-<N>t`` chips), generation and since
    when; None for a pool of another machine type."""
    machine = str((pool.get("config") or {}).get("machineType") or "")
    family, _, chips = machine.rpartition("-")
    generation = next((g.name for g in GENERATIONS.values() if g.machine_family == family), None)
    if generation is None or not chips.endswith("t") or not chips[:-1].isdigit():
        return None
    nodes = int(pool.get("initialNodeCount") or (pool.get("autoscaling") or {}).get("totalMaxNodeCount") or 0)
    task = ((pool.get("config") or {}).get("resourceLabels") or {}).get(GCE_TASK_LABEL)
    return {"chips": nodes * int(chips[:-1]), "generation": generation, "created_at": created, "role": task}


def find_policy_orphans(compute: Any, project_id: str, region: str, pools: list[dict[str, Any]],
                        orphan_pools: set[str], running: Mapping[str, list[str]], older_than: float, now: float,
                        wait_timeout: float = 600.0, covered: Collection[str] | None = None,
                        unreadable: list[Orphan] | None = None,
                        dead: Mapping[str, str] | None = None) -> list[Orphan]:  # fmt: skip
    """The workload policies tpuflow made in ``region`` that nothing live needs (``pools``: the cluster's, REST JSON)."""
    from tpuflow.gke.hooks import to_rest_json

    try:
        policies = [to_rest_json(p) for p in compute.list_resource_policies(project_id=project_id, region=region)]
    except Exception as err:
        raise ReaperListError(f"listing resource policies in {region}: {_first_line(err)}") from err
    users: dict[str, list[str]] = {}
    for pool in pools:
        policy = ((pool.get("placementPolicy") or {}).get("policyName") or "").rsplit("/", 1)[-1]
        if policy:
            users.setdefault(policy, []).append(pool["name"])
    found = []
    for policy in policies:
        if not policy.get("workloadPolicy"):
            continue
        name = policy["name"]
        reason = policy_orphan_reason(
            policy.get("description"), users.get(name, []), orphan_pools, running, covered, dead
        )
        if isinstance(reason, OwnerUnreadable):
            _note(unreadable, Orphan("workload_policy", name, f"projects/{project_id}/regions/{region}", reason))
            continue
        stamp = policy.get("creationTimestamp")
        young = bool(stamp and now - rfc3339_to_unix(stamp) < older_than) and not isinstance(reason, SupervisorGone)
        if reason is None or young:
            continue

        def delete(name: str = name) -> Any:
            return delete_policy(compute, project_id, region, name, wait_timeout)

        found.append(Orphan("workload_policy", name, f"projects/{project_id}/regions/{region}", reason, delete))
    return found


def delete_policy(compute: Any, project_id: str, region: str, name: str, timeout: float) -> None:
    """Delete one resource policy and wait for its regional operation."""
    from tpuflow.gke.policy_provisioning import COMPUTE_DONE, compute_operation_error

    operation = compute.delete_resource_policy(project_id=project_id, region=region, name=name)
    deadline = time.monotonic() + timeout
    while operation is not None and operation.status != COMPUTE_DONE:
        if time.monotonic() > deadline:
            raise TimeoutError(f"deleting resource policy {name}: operation {operation.name} still running")
        time.sleep(1.0)
        operation = compute.get_region_operation(project_id=project_id, region=region, name=operation.name)
    error = compute_operation_error(operation) if operation is not None else None
    if error:
        raise RuntimeError(f"deleting resource policy {name}: {error}")


def delete_pool(hook: Any, project_id: str, cluster_name: str, name: str, timeout: float) -> None:
    """Delete one pool, waiting out an operation still running on it (its create) first."""
    deadline = time.monotonic() + timeout
    while True:
        running = hook.find_running_operation(project_id=project_id, cluster_name=cluster_name, node_pool_name=name)
        if running is not None:
            hook.wait_for_node_pool_operation(running.name, project_id=project_id, poll_interval=1.0,
                                              timeout=max(1.0, deadline - time.monotonic()))  # fmt: skip
        operation = hook.delete_node_pool(project_id=project_id, cluster_name=cluster_name, node_pool_name=name)
        if operation is None:
            return
        hook.wait_for_node_pool_operation(operation, project_id=project_id, poll_interval=1.0,
                                          timeout=max(1.0, deadline - time.monotonic()))  # fmt: skip
        return


def find_kube_orphans(hook: Any, namespace: str, running: Mapping[str, list[str]], older_than: float,
                      now: float, covered: Collection[str] | None = None, kept: list[Orphan] | None = None,
                      unreadable: list[Orphan] | None = None,
                      dead: Mapping[str, str] | None = None) -> list[Orphan]:  # fmt: skip
    """The orphan RayServices and RayClusters (a RayService's own RayCluster is judged with it, never alone);
    the kept ones (with the kept mark) are added to ``kept``, ours whose owner cannot be read to ``unreadable``."""

    found = []
    # services first: deleting a RayService removes its own RayCluster
    for plural in (RAYSERVICES, RAYCLUSTERS):
        try:
            listing = hook.custom_object_client.list_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, label_selector=f"{MANAGED_BY}={MANAGED_BY_VALUE}"
            )
        except Exception as err:
            raise ReaperListError(f"listing {plural} in namespace {namespace}: {_first_line(err)}") from err
        for item in listing.get("items", []):
            meta = item.get("metadata") or {}
            if any(ref.get("kind") == "RayService" for ref in meta.get("ownerReferences") or []):
                continue  # a RayService's own cluster goes with it
            labels = meta.get("labels") or {}
            reason = kube_orphan_reason(labels, running, covered, now, meta.get("annotations"), dead)
            if isinstance(reason, OwnerUnreadable):
                kind = KIND_BY_PLURAL[plural].lower()
                _note(unreadable, Orphan(kind, meta["name"], f"namespace {namespace}", reason))
                continue
            if reason is None:
                if kept is not None and is_kept(meta.get("labels")):
                    kept.append(Orphan(KIND_BY_PLURAL[plural].lower(), meta["name"], f"namespace {namespace}",
                                       _kept_reason()))  # fmt: skip
                continue
            stamp = meta.get("creationTimestamp")
            if stamp and now - rfc3339_to_unix(stamp) < older_than and not isinstance(reason, SupervisorGone):
                continue

            # background: the reaper waits for no object, so the orphan is gone when it says "deleted" and the
            # garbage collector stops its pods after it (a node pool reaped first has taken their node already)
            def delete(plural: str = plural, name: str = meta["name"]) -> Any:
                return hook.delete(plural, name, namespace, foreground=False)

            kind = KIND_BY_PLURAL[plural].lower()
            run = _owner_run_digest(labels, meta.get("annotations"))
            found.append(Orphan(kind, meta["name"], f"namespace {namespace}", reason, delete, run))
    return found


def _owner_run_digest(labels: Mapping[str, str], annotations: Mapping[str, str] | None) -> str | None:
    """The owner run's digest of a Kubernetes object: its owner record's, else its label's."""
    owner = TaskIdentity.from_record((annotations or {}).get(OWNER_ANNOTATION))
    return owner.run_digest if owner is not None else labels.get(OWNER_RUN_LABEL)


def find_local_orphans(running: Mapping[str, list[str]], older_than: float, now: float, base_dir: Any = None,
                       covered: Collection[str] | None = None, kept: list[Orphan] | None = None,
                       unreadable: list[Orphan] | None = None) -> list[Orphan]:  # fmt: skip
    """The orphan local clusters; the kept ones still running are added to ``kept``, a run's whose owner record
    cannot be read to ``unreadable``."""

    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster, default_base_dir

    root = Path(base_dir) if base_dir else default_base_dir()
    found = []
    for state in sorted(root.glob(f"*/{STATE_FILE}")):
        try:
            cluster = LocalRayCluster.load(state.parent)
        except (OSError, ValueError, TypeError) as err:
            raise ReaperListError(f"reading local cluster state {state}: {_first_line(err)}") from err
        alive = cluster.is_alive()
        dead = _supervisor_dead(cluster)
        owner = TaskIdentity.from_record(cluster.owner)
        run = owner.run_digest if owner is not None else None
        if dead is not None:  # proof its run is over: no minimum age
            stop = partial(_stop_and_remove, cluster)
            found.append(Orphan("local_cluster", cluster.name, str(state.parent), dead, stop, run))
            continue
        reason = local_orphan_reason(
            cluster.name, alive, running, covered, cluster.expires_at, now, cluster.kept, cluster.owner
        )
        if isinstance(reason, OwnerUnreadable):
            _note(unreadable, Orphan("local_cluster", cluster.name, str(state.parent), reason))
            continue
        if (
            reason is None
            and kept is not None
            and cluster.kept
            and alive
            and _is_run_cluster(cluster.name, cluster.owner)
        ):
            kept.append(Orphan("local_cluster", cluster.name, str(state.parent), _kept_reason()))
        if reason is None or now - (cluster.started_at or now) < older_than:
            continue
        found.append(Orphan("local_cluster", cluster.name, str(state.parent), reason, cluster.stop, run))
    return found


def _note(unreadable: list[Orphan] | None, entry: Orphan) -> None:
    """Record a resource whose owner cannot be read (never deleted), and log it whoever asked."""
    log.warning("not deleting %s", entry.line())
    if unreadable is not None:
        unreadable.append(entry)


def find_lease_orphans(
    store: Any,
    running: Mapping[str, list[str]],
    slots: int | None = None,
    covered: Collection[str] | None = None,
    renew: list[Orphan] | None = None,
) -> list[Orphan]:
    """The leases (every one in the store; ``slots``: only the first ``slots``) whose holder is provably dead (its
    supervising process gone: whatever its run's state says), past its expiry while its run is not known to be
    running, or whose run is not running. A lease past its expiry whose run is running (a covered DAG's) is no
    orphan: it goes to ``renew`` (its ``delete`` renews it), so a training that outlives the expiry keeps its slice."""
    try:
        held = store.all_holders() if slots is None else store.holders(slots)
    except Exception as err:
        raise ReaperListError(f"listing slice leases in {store.describe()}: {_first_line(err)}") from err
    found = []
    for slot, lease in sorted(held.items()):
        dag, _, run = lease.holder.partition("/")
        is_running = bool(run) and _covers(covered, dag) and run in running.get(dag, [])
        supervisor_dead = dead_reason(lease.supervisor)
        dead = lease.dead_reason(now=None)
        if supervisor_dead is None and dead is not None and is_running:
            if renew is not None:

                def renew_it(holder: str = lease.holder, upto: int = slot + 1) -> Any:
                    return store.renew(holder, upto)

                why = f"held by {lease.holder_line()}: {dead}, but its run is still running"
                renew.append(Orphan("lease", f"slot {slot}", store.describe(), why, renew_it))
            continue
        if dead is not None:
            reason = f"held by {lease.holder_line()}: {dead}"
        elif not _covers(covered, dag) or is_running:
            continue  # a DAG not covered: its run may well be running
        else:
            reason = f"held by {lease.holder}, which is not running"

        def release(holder: str = lease.holder) -> Any:
            return store.release(holder)

        found.append(Orphan("lease", f"slot {slot}", store.describe(), reason, release))
    return found


def _supervisor_dead(cluster: Any) -> str | None:
    """Why a run's local cluster is an orphan by its supervising process (tpuflow.liveness: provably dead),
    whatever its run's state says; None: alive, not provable, kept on purpose, or not a run's cluster."""

    if cluster.kept or not _is_run_cluster(cluster.name, cluster.owner):
        return None
    reason = dead_reason(getattr(cluster, "supervisor", None))
    return None if reason is None else f"the process that supervised its run is gone ({reason})"


def _stop_and_remove(cluster: Any) -> None:
    """Stop the cluster's processes and remove its state folder (nothing of a dead run is left)."""

    cluster.stop()
    shutil.rmtree(cluster.state_dir, ignore_errors=True)


def reap(
    orphans: list[Orphan],
    *,
    dry_run: bool,
    say: Callable[[str], None] = print,
    kept: Iterable[Orphan] | None = None,
    unreadable: Iterable[Orphan] | None = None,
) -> dict[str, Any]:
    """Delete each orphan (dry run: only list them), and say which kept resources were skipped (``kept``, default
    the ``kept`` of collect_orphans' answer) and which were left because their owner cannot be read
    (``unreadable``, default the answer's). Renews the expired leases of runs still running (the answer's
    ``renew``; a dry run only lists them). Returns {"dry_run", "found", "deleted", "failed", "kept", "unreadable",
    "renewed"}."""
    spared = list(getattr(orphans, "kept", []) if kept is None else kept)
    unread = list(getattr(orphans, "unreadable", []) if unreadable is None else unreadable)
    renewed = _renew_live_leases(list(getattr(orphans, "renew", [])), dry_run, say)
    if unread:
        say(
            f"left {len(unread)} resource(s) tpuflow made whose owner cannot be read (no owner record, or a "
            "malformed one): never deleted by the reaper; check each and delete it yourself if no run needs it"
        )
        for entry in unread:
            say(f"owner unreadable {entry.line()}")
    if spared:
        say(
            f"skipped {len(spared)} kept endpoint resource(s) (keep_endpoint): still running, and billed until you "
            "delete them (how: the tpuflow.cost.reaper docstring, or docs/cost-and-goodput.md, Orphan reaper)"
        )
        for entry in spared:
            say(f"kept {entry.line()}")
    deleted, failed = [], []
    for orphan in orphans:
        if dry_run:
            say(f"would delete {orphan.line()}")
            continue
        try:
            orphan.delete()
        except Exception as err:  # one failure must not leave the other orphans billed
            say(f"could not delete {orphan.line()}: {_first_line(err)}")
            failed.append(orphan.line())
            continue
        say(f"deleted {orphan.line()}")
        deleted.append(orphan.line())
    if not orphans:
        say("no orphans found")
    return {
        "dry_run": dry_run,
        "found": [o.line() for o in orphans],
        "deleted": deleted,
        "failed": failed,
        "kept": [entry.line() for entry in spared],
        "unreadable": [entry.line() for entry in unread],
        "renewed": renewed,
    }


def _renew_live_leases(leases: list[Orphan], dry_run: bool, say: Callable[[str], None]) -> list[str]:
    """Renew each expired lease of a run still running (its ``delete`` renews); the lines renewed."""
    renewed = []
    for lease in leases:
        if dry_run:
            say(f"would renew {lease.line()}")
            continue
        try:
            lease.delete()
        except Exception as err:  # not renewed: a waiter renews it too, after asking the run's state itself
            say(f"could not renew {lease.line()}: {_first_line(err)}")
            continue
        say(f"renewed {lease.line()}")
        renewed.append(lease.line())
    return renewed


# --- after a reaper run: the killed runs' ledgers ----------------------------------------------------
REAPED_LEDGER_FILE = "reaped_ledger.json"
# a dead run's record with nothing of it left is forgotten once every resource it made is past its default expiry
_FORGET_AFTER_S = 2 * 24 * 3600.0


def settle_dead_runs(
    orphans: Orphans,
    outcome: Mapping[str, Any],
    *,
    output_root: str | None,
    gcp_conn_id: str = "google_cloud_default",
    say: Callable[[str], None] = print,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """For each run whose supervisor is provably dead and whose orphans were all deleted: book the chip time of
    its node pools in ``OUTPUT_ROOT/DAG_ID/DATE/reaped_ledger.json`` (what its ledger task, killed with it, never
    wrote; entries accumulate) and forget its supervision record. A dry run, or a run with an orphan left, changes
    nothing. Returns the ledger entries written."""
    store = orphans.supervision
    if outcome.get("dry_run") or store is None:
        return []
    now = time.time() if now is None else now
    failed = set(outcome.get("failed") or [])
    written = []
    for digest, (entry, why) in sorted(orphans.dead_runs.items()):
        mine = [o for o in orphans if o.run == digest]
        if not mine:
            if now - entry.recorded_at > _FORGET_AFTER_S:
                store.forget(digest)
            continue
        if any(o.line() in failed for o in mine):
            continue
        slices = [
            slice_entry(
                o.bill.get("role") or o.name,
                o.bill["generation"],
                o.bill["chips"],
                o.bill["created_at"],
                now,
                pools=[o.name],
                now=now,
            )  # fmt: skip
            for o in mine
            if o.kind == "node_pool" and o.bill
        ]
        if slices:
            ledger = {
                **build_ledger(slices),
                "dag_id": entry.dag_id,
                "run_id": entry.run_id,
                "reaped_at": now,
                "reason": f"its supervising process is gone ({why})",
            }
            where = _book(ledger, entry, output_root, gcp_conn_id)
            say(f"ledger: run {entry.dag_id}/{entry.run_id} billed {ledger['chip_hours']} chip-hours until reaped"
                + (f" (written to {where})" if where else " (no output root: not written)"))  # fmt: skip
            written.append(ledger)
        store.forget(digest)
    return written


# a finished run's record is kept this long (its resources are past their default expiry by then), then forgotten
RECORD_TTL_S = 7 * 24 * 3600.0


def prune_supervision(
    store: Any,
    running: Mapping[str, list[str]],
    covered: Collection[str] | None,
    now: float | None = None,
) -> list[str]:
    """Forget the records of runs that are over (a covered DAG's run that is not running) and older than
    RECORD_TTL_S, so the store holds about a week of runs; returns the forgotten runs (DAG/RUN)."""
    now = time.time() if now is None else now
    forgotten = []
    for digest, entry in store.all().items():
        if now - entry.recorded_at < RECORD_TTL_S or not _covers(covered, entry.dag_id):
            continue
        if entry.run_id in running.get(entry.dag_id, []):
            continue
        store.forget(digest)
        forgotten.append(f"{entry.dag_id}/{entry.run_id}")
    return forgotten


def _book(ledger: dict[str, Any], entry: Any, output_root: str | None, gcp_conn_id: str) -> str | None:
    """Add ``ledger`` to the run's reaped_ledger.json (RUN = OUTPUT_ROOT/DAG_ID/DATE); its URI, or None."""
    if not output_root or not entry.date:
        return None
    uri = f"{output_root.rstrip('/')}/{entry.dag_id}/{entry.date}/{REAPED_LEDGER_FILE}"
    try:
        earlier = json.loads(read_text(uri, gcp_conn_id) or "[]")
    except ValueError:
        earlier = []
    entries = [*(earlier if isinstance(earlier, list) else []), ledger]
    return write_text(uri, json.dumps(entries, indent=2), gcp_conn_id)


# --- run states -----------------------------------------------------------------------------------------
class MetadataDbRunStates:
    """Running and queued runs, from the Airflow metadata DB (the CLI; it runs where Airflow is configured).
    Covers every DAG: one with no run in the DB has none running."""

    dag_ids: Collection[str] | None = None

    def running(self) -> dict[str, list[str]]:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState
        from sqlalchemy import select

        out: dict[str, list[str]] = {}
        try:
            with create_session() as session:
                rows = session.execute(
                    select(DagRun.dag_id, DagRun.run_id).where(
                        DagRun.state.in_([DagRunState.RUNNING, DagRunState.QUEUED])
                    )
                ).all()
        except Exception as err:
            raise ReaperListError(f"reading running DAG runs from the Airflow metadata DB: {_first_line(err)}") from err
        for dag_id, run_id in rows:
            out.setdefault(dag_id, []).append(run_id)
        return out


class FixedRunStates:
    """Run states given up front (tests, and callers that asked the Airflow API themselves), of
    ``dag_ids`` (None: every DAG)."""

    def __init__(self, running: Mapping[str, list[str]], dag_ids: Iterable[str] | None = None) -> None:
        self._running = {k: list(v) for k, v in running.items()}
        self.dag_ids: list[str] | None = None if dag_ids is None else list(dag_ids)

    def running(self) -> dict[str, list[str]]:
        return dict(self._running)


# --- one reaper run -------------------------------------------------------------------------------------
@dataclass
class ReaperScope:
    """Where to look. GKE needs project, location and cluster; Kubernetes a connection (or the GKE cluster)."""

    gcp_conn_id: str = "google_cloud_default"
    project_id: str | None = None
    location: str | None = None
    cluster_name: str | None = None
    kubernetes_conn_id: str | None = None
    namespace: str | None = None
    local_base_dir: str | None = None
    lease_root: str | None = None
    kube: bool = True
    local: bool = True
    leases: bool = True

    @property
    def gke(self) -> bool:
        return bool(self.project_id and self.location and self.cluster_name)


def _kube_hook(scope: ReaperScope) -> Any:
    from tpuflow.kuberay.hooks import GKEKubeRayHook, KubeRayHook
    from tpuflow.kubernetes.hooks import resolve_gke_target

    if scope.kubernetes_conn_id:
        return KubeRayHook(conn_id=scope.kubernetes_conn_id)
    gke = {"project_id": scope.project_id, "location": scope.location, "cluster_name": scope.cluster_name}
    target = resolve_gke_target(gke, scope.gcp_conn_id, None)
    return GKEKubeRayHook(**target.gke_hook_kwargs())


def collect_orphans(scope: ReaperScope, states: RunStates, *, older_than: float, now: float | None = None) -> Orphans:
    """Every orphan in the scope (and, in the answer's ``kept``, what the kept mark spared), or ReaperListError
    before anything is deleted."""
    now = time.time() if now is None else now
    running, covered = states.running(), states.dag_ids
    orphans = Orphans()
    kept, unreadable = orphans.kept, orphans.unreadable
    dead = {}
    if scope.leases:
        from tpuflow.slices.leases import default_lease_root

        store = SupervisionStore(scope.lease_root or default_lease_root(), scope.gcp_conn_id)
        try:
            orphans.dead_runs = dead_runs(store)
        except Exception as err:
            raise ReaperListError(f"reading run supervisors in {store.describe()}: {_first_line(err)}") from err
        orphans.supervision = store
        dead = {digest: reason for digest, (_, reason) in orphans.dead_runs.items()}
    if scope.gke:
        from tpuflow.gke.hooks import ComputeResourcePolicyHook, GKENodePoolHook

        project, cluster = scope.project_id or "", scope.cluster_name or ""
        hook = GKENodePoolHook(gcp_conn_id=scope.gcp_conn_id, location=scope.location)
        pools, operations = list_pools(hook, project, cluster)
        pool_orphans = find_pool_orphans(
            hook,
            project,
            cluster,
            pools,
            operations,
            running,
            older_than,
            now,
            covered=covered,
            kept=kept,
            unreadable=unreadable,
            dead=dead,
        )
        compute = ComputeResourcePolicyHook(gcp_conn_id=scope.gcp_conn_id)
        region = region_of(scope.location or "")
        orphan_pools = {o.name for o in pool_orphans}
        # after their pools: GKE refuses to delete a policy a pool still uses
        orphans += pool_orphans
        orphans += find_policy_orphans(
            compute,
            project,
            region,
            pools,
            orphan_pools,
            running,
            older_than,
            now,
            covered=covered,
            unreadable=unreadable,
            dead=dead,
        )
    if scope.kube and (scope.gke or scope.kubernetes_conn_id):
        try:
            hook = _kube_hook(scope)
            namespace = scope.namespace or hook.default_namespace()
        except Exception as err:
            raise ReaperListError(f"reaching the Kubernetes API: {_first_line(err)}") from err
        orphans += find_kube_orphans(hook, namespace, running, older_than, now, covered, kept, unreadable, dead)
    if scope.local:
        orphans += find_local_orphans(running, older_than, now, scope.local_base_dir, covered, kept, unreadable)
    if scope.leases:
        from tpuflow.slices.leases import lease_store

        leases = lease_store(scope.lease_root, scope.gcp_conn_id)
        orphans += find_lease_orphans(leases, running, covered=covered, renew=orphans.renew)
    return orphans


# the tag every DAG tpu_pipeline builds carries (tpuflow.pipeline.factory): the hourly reaper judges each such DAG
PIPELINE_TAG = "tpuflow"


def tagged_dag_ids(ti: Any, tag: str = PIPELINE_TAG) -> list[str]:
    """The DAGs tagged ``tag`` in the reaper task's own DAG bundle, parsed as Airflow's task runner parses one
    (a DagBag of the bundle's folder, DAG discovery's safe mode as configured): every tpu_pipeline DAG there,
    whether or not a run of it recorded itself. [] where the task instance has no bundle (a test double)."""
    bundle = getattr(ti, "bundle_instance", None)
    folder = getattr(bundle, "path", None)
    if folder is None:
        return []
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(
        dag_folder=folder, load_op_links=False, bundle_path=Path(folder), bundle_name=getattr(bundle, "name", None)
    )
    if bag.import_errors:
        log.warning("DAG files of %s that do not parse (their DAGs are not covered): %s", folder,
                    ", ".join(sorted(bag.import_errors)))  # fmt: skip
    return sorted(dag_id for dag_id, dag in bag.dags.items() if tag in (dag.tags or ()))


_FINISHED_TASK_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


class TaskSdkRunStates:
    """Running runs of ``dag_ids``, asked from inside a task through the Task SDK (Airflow 3 tasks have
    no metadata DB access): the runs with an unfinished task, confirmed by their run state. Covers only
    ``dag_ids``: another DAG's resources are not its to judge."""

    def __init__(self, ti: Any, dag_ids: Iterable[str]) -> None:
        self.ti = ti
        self.dag_ids: list[str] = list(dag_ids)

    def running(self) -> dict[str, list[str]]:

        out: dict[str, list[str]] = {}
        for dag_id in self.dag_ids:
            try:
                by_run = self.ti.get_task_states(dag_id=dag_id) or {}
                for run_id, tasks in by_run.items():
                    if all(str(state) in _FINISHED_TASK_STATES for state in (tasks or {}).values()) and tasks:
                        continue
                    if run_is_over(self.ti, dag_id, run_id) is None:  # running, queued, or unreadable: kept
                        out.setdefault(dag_id, []).append(run_id)
            except Exception as err:
                text = str(err).lower()
                if "404" in text or "not found" in text or "not_found" in text:
                    continue  # a DAG deleted from Airflow (a run of it recorded once): none of its runs is running
                raise ReaperListError(f"asking Airflow for the running runs of {dag_id}: {_first_line(err)}") from err
        return out
