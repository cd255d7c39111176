"""KubeRay status semantics (KubeRay v1.7, see ../shared/kuberay/README.md) as pure functions.

`raycluster_verdict` / `rayservice_verdict` turn a custom object into ready / failed(reason) /
waiting(why). The triggers and the synchronous waits both use these, so "ready" means one thing on
the operator side; the simulated KubeRay controller (tpuflow_rehearsal.standins) keeps its own reading of
KubeRay's documented status, so the stand-in does not grade itself with the operator's rules. The
status pieces read here are typed (``RayClusterStatus``, ``RayServiceStatus``, ``Condition``, ...).

RayCluster: ready = conditions RayClusterProvisioned=True and HeadPodReady=True (both stay set once
reached) and readyWorkerReplicas >= desiredWorkerReplicas (current health). ReplicaFailure=True
(KubeRay could not create a pod) and a suspended cluster are failures. `state == "ready"` is only a
fallback for controllers that set no conditions.

RayService: ready = condition Ready=True, every application of the active cluster RUNNING and
numServeEndpoints > 0. An application DEPLOY_FAILED or UNHEALTHY fails fast, as does the Ready
condition with reason ValidationFailed or InitializingTimeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict, cast

READY: Final = "ready"
FAILED: Final = "failed"
WAITING: Final = "waiting"
FAILED_APP_STATUSES = ("DEPLOY_FAILED", "UNHEALTHY")
TERMINAL_SERVICE_REASONS = ("ValidationFailed", "InitializingTimeout")


class Condition(TypedDict, total=False):
    """One entry of ``status.conditions`` (metav1.Condition)."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    observedGeneration: int
    lastTransitionTime: str


class HeadInfo(TypedDict, total=False):
    podName: str
    podIP: str
    serviceName: str
    serviceIP: str


class RayClusterStatus(TypedDict, total=False):
    """The parts of a RayCluster's ``status`` tpuflow reads (KubeRay v1.7 CRD)."""

    state: str
    reason: str
    conditions: list[Condition]
    desiredWorkerReplicas: int
    readyWorkerReplicas: int
    observedGeneration: int
    head: HeadInfo
    endpoints: dict[str, str]


class ServeDeploymentStatus(TypedDict, total=False):
    status: str  # HEALTHY | UPDATING | UNHEALTHY | DEPLOY_FAILED ...
    message: str


class ServeApplicationStatus(TypedDict, total=False):
    status: str  # RUNNING | DEPLOYING | DEPLOY_FAILED | UNHEALTHY | NOT_STARTED ...
    message: str
    serveDeploymentStatuses: dict[str, ServeDeploymentStatus]


class ServiceClusterStatus(TypedDict, total=False):
    """``activeServiceStatus`` / ``pendingServiceStatus`` of a RayService."""

    rayClusterName: str
    applicationStatuses: dict[str, ServeApplicationStatus]


class RayServiceStatus(TypedDict, total=False):
    """The parts of a RayService's ``status`` tpuflow reads (KubeRay v1.7 CRD)."""

    conditions: list[Condition]
    numServeEndpoints: int
    observedGeneration: int
    serviceStatus: str
    activeServiceStatus: ServiceClusterStatus
    pendingServiceStatus: ServiceClusterStatus


def cluster_status(obj: Mapping[str, Any] | None) -> RayClusterStatus:
    return cast(RayClusterStatus, (obj or {}).get("status") or {})


def service_status(obj: Mapping[str, Any] | None) -> RayServiceStatus:
    return cast(RayServiceStatus, (obj or {}).get("status") or {})


@dataclass(frozen=True)
class Verdict:
    state: Literal["ready", "failed", "waiting"]
    reason: str

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def failed(self) -> bool:
        return self.state == FAILED

    def to_dict(self) -> dict[str, str]:
        return {"state": self.state, "reason": self.reason}


def conditions(obj: Mapping[str, Any]) -> dict[str, Condition]:
    found = cast(list[Condition], ((obj.get("status") or {}).get("conditions") or []))
    return {str(c.get("type")): c for c in found if isinstance(c, Mapping)}


def _true(cond: Condition | None) -> bool:
    return cond is not None and str(cond.get("status")) == "True"


def _explain(cond: Condition | None, name: str) -> str:
    if not cond:
        return f"{name} not reported yet"
    detail = ": ".join(p for p in (cond.get("reason"), cond.get("message")) if p)
    return f"{name}={cond.get('status')}" + (f" ({detail})" if detail else "")


def _not_observed(obj: Mapping[str, Any], kind: str) -> Verdict | None:
    """Waiting while KubeRay has not reconciled the latest spec (observedGeneration behind generation)."""
    generation = (obj.get("metadata") or {}).get("generation")
    observed = (obj.get("status") or {}).get("observedGeneration")
    if generation is not None and observed is not None and int(observed) < int(generation):
        name = (obj.get("metadata") or {}).get("name", "?")
        return Verdict(
            WAITING,
            f"{kind} {name}: KubeRay has not reconciled the latest spec yet (generation "
            f"{generation}, observed {observed})",
        )
    return None


def desired_workers(obj: Mapping[str, Any]) -> int:
    """desiredWorkerReplicas, or sum(replicas x numOfHosts) over unsuspended groups when not reported."""
    status = cluster_status(obj)
    if status.get("desiredWorkerReplicas") is not None:
        return int(status["desiredWorkerReplicas"])
    groups = (obj.get("spec") or {}).get("workerGroupSpecs") or []
    return sum(
        int(g.get("replicas", 0) or 0) * int(g.get("numOfHosts", 1) or 1) for g in groups if not g.get("suspend")
    )


def _unreported(obj: Mapping[str, Any] | None, kind: str) -> Verdict | None:
    """The verdict before KubeRay reports anything: the object is missing, or has no status yet."""
    if not obj:
        return Verdict(WAITING, f"the {kind} does not exist (yet)")
    if not obj.get("status"):
        name = (obj.get("metadata") or {}).get("name", "?")
        return Verdict(WAITING, f"{kind} {name}: KubeRay has not reported any status yet (is the operator running?)")
    return None


def raycluster_verdict(obj: Mapping[str, Any] | None) -> Verdict:
    name = ((obj or {}).get("metadata") or {}).get("name", "?")
    if obj and (obj.get("metadata") or {}).get("deletionTimestamp"):
        return Verdict(FAILED, f"RayCluster {name} is being deleted")
    early = _unreported(obj, "RayCluster")
    if early is not None or obj is None:
        return early or Verdict(WAITING, "the RayCluster does not exist (yet)")
    status = cluster_status(obj)
    conds = conditions(obj)
    failure = conds.get("ReplicaFailure")
    if _true(failure):
        return Verdict(
            FAILED, f"RayCluster {name}: KubeRay could not create its pods: {_explain(failure, 'ReplicaFailure')}"
        )
    if _true(conds.get("RayClusterSuspended")) or status.get("state") == "suspended":
        return Verdict(FAILED, f"RayCluster {name} is suspended")
    if str(status.get("state", "")).lower() == "failed":
        return Verdict(FAILED, f"RayCluster {name} failed: {status.get('reason') or 'no reason given'}")
    lag = _not_observed(obj, "RayCluster")
    if lag is not None:
        return lag
    desired = desired_workers(obj)
    ready_workers = int(status.get("readyWorkerReplicas") or 0)
    provisioned, head = conds.get("RayClusterProvisioned"), conds.get("HeadPodReady")
    if conds:
        if _true(provisioned) and _true(head):
            if ready_workers >= desired:
                return Verdict(READY, f"RayCluster {name} is ready ({ready_workers}/{desired} workers)")
            return Verdict(WAITING, f"RayCluster {name}: {ready_workers}/{desired} worker pods ready")
        parts = [
            _explain(provisioned, "RayClusterProvisioned"),
            _explain(head, "HeadPodReady"),
            f"{ready_workers}/{desired} worker pods ready",
        ]
        return Verdict(WAITING, f"RayCluster {name}: " + "; ".join(parts))
    if status.get("state") == "ready" and ready_workers >= desired:
        return Verdict(READY, f"RayCluster {name} is ready (state=ready, {ready_workers}/{desired} workers)")
    return Verdict(
        WAITING,
        f"RayCluster {name}: state={status.get('state') or 'unset'}, {ready_workers}/{desired} worker pods ready",
    )


def application_statuses(
    obj: Mapping[str, Any],
    which: Literal["activeServiceStatus", "pendingServiceStatus"] = "activeServiceStatus",
) -> dict[str, ServeApplicationStatus]:
    return dict((service_status(obj).get(which) or {}).get("applicationStatuses") or {})


def service_cluster_name(obj: Mapping[str, Any]) -> str:
    """The RayCluster a RayService serves from: the active one, else the pending one ("" before either)."""
    return _serving_status(obj)[1]


def _deployment_problems(app: ServeApplicationStatus, wanted: tuple[str, ...] | None = None) -> list[str]:
    out = []
    for dep, st in (app.get("serveDeploymentStatuses") or {}).items():
        status = st.get("status", "")
        if (wanted is None and status != "HEALTHY") or (wanted is not None and status in wanted):
            msg = st.get("message") or ""
            out.append(f"deployment {dep!r} is {status}" + (f": {msg}" if msg else ""))
    return out


def rayservice_verdict(obj: Mapping[str, Any] | None) -> Verdict:
    early = _unreported(obj, "RayService")
    if early is not None or obj is None:
        return early or Verdict(WAITING, "the RayService does not exist (yet)")
    name = (obj.get("metadata") or {}).get("name", "?")
    status = service_status(obj)
    for which in _WHICH:
        for app, st in application_statuses(obj, which).items():
            if st.get("status") in FAILED_APP_STATUSES:
                details = [st.get("message") or "", *_deployment_problems(st, ("UNHEALTHY", "DEPLOY_FAILED"))]
                text = "; ".join(d for d in details if d)
                return Verdict(
                    FAILED,
                    f"RayService {name}: application {app!r} is {st.get('status')}" + (f": {text}" if text else ""),
                )
    ready = conditions(obj).get("Ready")
    if ready and not _true(ready) and ready.get("reason") in TERMINAL_SERVICE_REASONS:
        return Verdict(FAILED, f"RayService {name}: {_explain(ready, 'Ready')}")
    lag = _not_observed(obj, "RayService")
    if lag is not None:
        return lag
    upgrading = conditions(obj).get("UpgradeInProgress")
    if upgrading and _true(upgrading):  # the active cluster still serves the old spec until the pending one is promoted
        pending = (status.get("pendingServiceStatus") or {}).get("rayClusterName") or "?"
        active = (status.get("activeServiceStatus") or {}).get("rayClusterName") or "?"
        return Verdict(WAITING, f"RayService {name}: upgrading, Ray cluster {pending} is to replace {active}")
    apps = application_statuses(obj)
    endpoints = int(status.get("numServeEndpoints") or 0)
    not_running = {a: s for a, s in apps.items() if s.get("status") != "RUNNING"}
    if _true(ready) and apps and not not_running and endpoints > 0:
        return Verdict(
            READY, f"RayService {name} is ready: {', '.join(sorted(apps))} RUNNING, {endpoints} Serve endpoint(s)"
        )
    return Verdict(WAITING, f"RayService {name}: " + "; ".join(_service_waiting_parts(obj)))


_WHICH: tuple[Literal["activeServiceStatus", "pendingServiceStatus"], ...] = (
    "activeServiceStatus",
    "pendingServiceStatus",
)


def _serving_status(obj: Mapping[str, Any]) -> tuple[Literal["activeServiceStatus", "pendingServiceStatus"], str]:
    """(which status block, cluster name) the applications are reported under: the active cluster, or the
    pending one (a new RayService's first cluster stays pending until its applications are RUNNING)."""
    status = service_status(obj)
    active = (status.get("activeServiceStatus") or {}).get("rayClusterName")
    if active:
        return "activeServiceStatus", str(active)
    return "pendingServiceStatus", str((status.get("pendingServiceStatus") or {}).get("rayClusterName") or "")


def _service_waiting_parts(obj: Mapping[str, Any]) -> list[str]:
    status = service_status(obj)
    which, cluster = _serving_status(obj)
    apps = application_statuses(obj, which)
    parts = []
    if which == "pendingServiceStatus" and not apps:
        parts.append(f"RayCluster {cluster or '(not created yet)'} is not ready yet")
    for app, st in apps.items():
        if st.get("status") != "RUNNING":
            deps = _deployment_problems(st)
            parts.append(
                f"application {app!r} is {st.get('status') or 'unknown'}"
                + (f" ({'; '.join(deps)})" if deps else (f": {st['message']}" if st.get("message") else ""))
            )
    if which == "activeServiceStatus" and not apps:
        parts.append("no Serve application reported yet")
    if int(status.get("numServeEndpoints") or 0) == 0:
        parts.append("no Serve endpoints yet")
    ready = conditions(obj).get("Ready")
    parts.append(_explain(ready, "Ready"))
    return parts


# --- why a wait ran out of time ----------------------------------------------------------------

_SCHEDULING_HINTS = (
    "resources required",
    "cannot be scheduled",
    "taken more than",
    "infeasible",
    "insufficient",
    "waiting for the cluster",
)


def stuck_service_diagnosis(obj: Mapping[str, Any], cluster_reason: str | None = None) -> str:
    """Which deployment is stuck and the most likely cause, for the deadline error."""
    status = service_status(obj)
    which, _ = _serving_status(obj)
    apps = application_statuses(obj, which)
    if which == "pendingServiceStatus" and not apps:
        return (
            "the RayService's RayCluster never became ready"
            + (f": {cluster_reason}" if cluster_reason else "")
            + ". Likely cause: no node pool matching the TPU worker group's node selector, or not enough "
            "free TPU nodes (see the FailedScheduling events)"
        )
    stuck = []
    for app, st in apps.items():
        if st.get("status") == "RUNNING":
            continue
        deps = {d: s for d, s in (st.get("serveDeploymentStatuses") or {}).items() if s.get("status") != "HEALTHY"}
        if not deps:
            stuck.append(
                f"application {app!r} is {st.get('status') or 'NOT_STARTED'}"
                + (f" ({st['message']})" if st.get("message") else "")
                + ". Likely cause: Serve has not started it (import_path not importable on the cluster, or "
                "a runtime_env still installing)"
            )
            continue
        for dep, s in deps.items():
            stuck.append(
                f"deployment {dep!r} of application {app!r} is {s.get('status')}"
                + (f" ({s['message']})" if s.get("message") else "")
                + ". Likely cause: "
                + _likely_cause(s)
            )
    if not stuck:
        if not apps:
            return "Serve reports no application on the RayCluster: the serveConfigV2 was not deployed (see events)"
        if int(status.get("numServeEndpoints") or 0) == 0:
            return (
                "every application is RUNNING but no pod serves traffic (numServeEndpoints=0). Likely cause: the "
                "Serve proxy is not healthy, or http_options do not listen on 0.0.0.0:8000"
            )
        return "KubeRay did not mark the RayService Ready: " + _explain(conditions(obj).get("Ready"), "Ready")
    return "; ".join(stuck)


def _likely_cause(dep_status: ServeDeploymentStatus) -> str:
    message = str(dep_status.get("message") or "").lower()
    if any(h in message for h in _SCHEDULING_HINTS):
        return (
            "its replicas' resource request cannot be placed on the cluster. A multi-host TPU model must reserve "
            "a whole slice: give the LLM config accelerator_type and accelerator_config with the slice's topology "
            "(TpuSlice.serve_accelerator_config()); otherwise lower the replica's TPU/CPU request to fit one host"
        )
    if "runtime_env" in message or "runtime env" in message:
        return "the replica's runtime_env is still being installed (pip/working_dir download)"
    if dep_status.get("status") in ("UPDATING", "DEPLOYING", ""):
        return (
            "the replica constructor has not finished: a multi-host model without accelerator_config topology "
            "falls back to per-chip bundles that can straddle slices and hang in DEPLOYING with no error; "
            "otherwise the model is still loading. Check the Serve replica logs on the head pod"
        )
    return "see the Serve controller logs on the head pod"


def head_service_name(cluster: Mapping[str, Any]) -> str:
    """The RayCluster's head Service: status.head.serviceName, else KubeRay's "<name>-head-svc"."""
    name = (cluster.get("metadata") or {}).get("name", "")
    return (cluster_status(cluster).get("head") or {}).get("serviceName") or f"{name}-head-svc"
