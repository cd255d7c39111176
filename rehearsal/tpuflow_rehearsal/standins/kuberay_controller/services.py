"""RayService reconciliation: an owned RayCluster, serveConfigV2 through the dashboard REST API, Serve statuses."""

from __future__ import annotations

import abc
import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any

import yaml

from tpuflow_rehearsal.standins.kuberay_controller.seams import RayClusterHandle
from tpuflow_rehearsal.standins.kuberay_controller.state import (
    ServiceState,
    owner_ref,
    short_hash,
    stamp_transitions,
)
from tpuflow_rehearsal.standins.kubernetes_api import (
    PODS,
    RAYCLUSTERS,
    RAYSERVICES,
    SERVICES,
    ApiError,
    ObjectStore,
    now_iso,
)


def _serve_config(text: str) -> dict[str, Any]:
    """serveConfigV2 (YAML) as the dict the RayService controller PUTs to /api/serve/applications/."""
    data = yaml.safe_load(text or "")
    if not isinstance(data, dict) or not isinstance(data.get("applications"), list):
        raise ValueError("serveConfigV2 must be a YAML mapping with an applications list")
    return data


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class RayServiceReconciler(abc.ABC):
    """Mixin of KubeRayController: everything RayService."""

    store: ObjectStore
    serve_poll_interval: float
    _services: dict[tuple[str, str], ServiceState]

    @abc.abstractmethod
    def handle_for(self, namespace: str, name: str) -> RayClusterHandle | None: ...

    @abc.abstractmethod
    def _event(
        self, obj: Mapping[str, Any], kind: str, reason: str, message: str, component: str = "kuberay-operator"
    ) -> None: ...

    def _reconcile_service(self, svc: dict[str, Any]) -> None:
        meta = svc["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if meta.get("deletionTimestamp"):
            return
        state = self._services.setdefault((ns, name), ServiceState())
        spec = svc.get("spec") or {}
        status = svc.get("status") or {}
        active = (status.get("activeServiceStatus") or {}).get("rayClusterName") or ""
        pending = (status.get("pendingServiceStatus") or {}).get("rayClusterName") or ""
        wanted_hash = short_hash(spec.get("rayClusterConfig") or {})
        strategy = (spec.get("upgradeStrategy") or {}).get("type") or "NewCluster"
        if active and not self.store.find(RAYCLUSTERS, ns, active):
            active = ""
        if pending and not self.store.find(RAYCLUSTERS, ns, pending):
            pending = ""
        if not active and not pending:
            pending = self._create_service_cluster(svc, wanted_hash)
        elif active and not pending and strategy != "None":
            current = self.store.find(RAYCLUSTERS, ns, active) or {}
            if (current.get("metadata") or {}).get("annotations", {}).get(
                "tpuflow.dev/standin-config-hash"
            ) != wanted_hash:
                pending = self._create_service_cluster(svc, wanted_hash)
        config_text = spec.get("serveConfigV2") or ""
        config_hash = short_hash(config_text)
        for cluster_name in (c for c in (active, pending) if c):
            self._sync_serve(svc, state, cluster_name, config_text, config_hash)
        # Promote a pending cluster once its applications run (KubeRay switches traffic then).
        if pending and self._apps_running(state.serve.get(pending)):
            old_active, active, pending = active, pending, ""
            if old_active:
                with contextlib.suppress(ApiError):
                    self.store.delete(RAYCLUSTERS, ns, old_active)
        self._ensure_service_services(svc, active)
        self._update_service_status(svc, state, active, pending)

    def _ensure_service_services(self, svc: dict[str, Any], active: str) -> None:
        """KubeRay's "<name>-head-svc" and "<name>-serve-svc", following the active cluster's head."""
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        handle = self.handle_for(ns, active) if active else None
        if handle is None:
            return
        ports = {
            "head-svc": [
                ("dashboard", handle.dashboard_url.rsplit(":", 1)[1]),
                ("gcs", handle.gcs_address.rsplit(":", 1)[1]),
                ("serve", str(handle.serve_port)),
            ],
            "serve-svc": [("serve", str(handle.serve_port))],
        }
        for suffix, named in ports.items():
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": f"{name}-{suffix}",
                    "namespace": ns,
                    "labels": {"ray.io/originated-from-cr-name": name, "ray.io/cluster": active},
                    "ownerReferences": [owner_ref(svc)],
                },
                "spec": {
                    "type": "ClusterIP",
                    "clusterIP": "127.0.0.1",
                    "selector": {"ray.io/cluster": active, "ray.io/node-type": "head"},
                    "ports": [{"name": n, "port": int(p), "targetPort": int(p), "protocol": "TCP"} for n, p in named],
                },
            }
            current = self.store.find(SERVICES, ns, body["metadata"]["name"])
            if current is None or current.get("spec") != body["spec"]:
                self.store.upsert(SERVICES, ns, body)

    def _create_service_cluster(self, svc: dict[str, Any], config_hash: str) -> str:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        cluster_name = f"{name}-raycluster-{short_hash([svc['metadata']['uid'], config_hash])}"
        labels = {
            **(svc["metadata"].get("labels") or {}),
            "ray.io/originated-from-crd": "RayService",
            "ray.io/originated-from-cr-name": name,
        }
        body = {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {
                "name": cluster_name,
                "namespace": ns,
                "labels": labels,
                "annotations": {"tpuflow.dev/standin-config-hash": config_hash},
                "ownerReferences": [owner_ref(svc)],
            },
            "spec": json.loads(json.dumps((svc.get("spec") or {}).get("rayClusterConfig") or {})),
        }
        try:
            self.store.create(RAYCLUSTERS, ns, body)
        except ApiError as err:
            if err.code != 409:
                self._event(svc, "Warning", "FailedToCreateRayCluster", err.message)
                return ""
        self._event(svc, "Normal", "CreatedRayCluster", f"Created RayCluster {ns}/{cluster_name}")
        return cluster_name

    def _sync_serve(
        self, svc: dict[str, Any], state: ServiceState, cluster_name: str, config_text: str, config_hash: str
    ) -> None:
        ns = svc["metadata"]["namespace"]
        cluster = self.store.find(RAYCLUSTERS, ns, cluster_name)
        handle = self.handle_for(ns, cluster_name)
        if cluster is None or handle is None or not self._cluster_serves(cluster):
            return
        if state.deployed_hash.get(cluster_name) != config_hash:
            try:
                config = _serve_config(config_text)
                handle.deploy_serve(config)
            except Exception as err:
                self._event(
                    svc,
                    "Warning",
                    "FailedToUpdateServeApplications",
                    f"Failed to update serve applications to the RayCluster {ns}/{cluster_name}: {err}",
                )
                return
            state.deployed_hash[cluster_name] = config_hash
            state.polled.pop(cluster_name, None)
            self._event(
                svc,
                "Normal",
                "UpdatedServeApplications",
                f"Updated serve applications to the RayCluster {ns}/{cluster_name}",
            )
        if time.monotonic() - state.polled.get(cluster_name, 0.0) >= self.serve_poll_interval:
            state.polled[cluster_name] = time.monotonic()
            try:
                state.serve[cluster_name] = handle.serve_status()
            except Exception as err:
                self._event(svc, "Warning", "FailedToGetServeApplicationStatuses", str(err)[:300])

    def _cluster_serves(self, cluster: Mapping[str, Any]) -> bool:
        """KubeRay sends the Serve config once the RayCluster is provisioned (condition RayClusterProvisioned)
        and its head pod is running and ready (the pods as the store has them now)."""
        conditions = {c.get("type"): c.get("status") for c in (cluster.get("status") or {}).get("conditions") or []}
        if conditions.get("RayClusterProvisioned") != "True":
            return False
        meta = cluster["metadata"]
        pods = self.store.list(PODS, meta["namespace"], f"ray.io/cluster={meta['name']}")
        return any(p["metadata"]["labels"].get("ray.io/node-type") == "head" and _pod_ready(p) for p in pods) and all(
            _pod_ready(p) for p in pods
        )

    @staticmethod
    def _apps_running(serve: Mapping[str, Any] | None) -> bool:
        apps = (serve or {}).get("applications") or {}
        return bool(apps) and all(a.get("status") == "RUNNING" for a in apps.values())

    @staticmethod
    def _app_statuses(serve: Mapping[str, Any] | None) -> dict[str, Any]:
        out = {}
        for app, st in ((serve or {}).get("applications") or {}).items():
            out[app] = {
                "status": st.get("status", ""),
                "message": st.get("message", "") or "",
                "serveDeploymentStatuses": {
                    d: {"status": ds.get("status", ""), "message": ds.get("message", "") or ""}
                    for d, ds in (st.get("deployments") or {}).items()
                },
            }
        return out

    @staticmethod
    def _healthy_proxies(serve: Mapping[str, Any] | None) -> int:
        proxies = (serve or {}).get("proxies") or {}
        return sum(1 for p in proxies.values() if (p.get("status") if isinstance(p, Mapping) else p) == "HEALTHY")

    def _update_service_status(self, svc: dict[str, Any], state: ServiceState, active: str, pending: str) -> None:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        active_serve = state.serve.get(active) if active else None
        endpoints = self._healthy_proxies(active_serve) if active and self._apps_running(active_serve) else 0
        ready = bool(active) and endpoints > 0
        state.ever_ready = state.ever_ready or ready
        reason = "NonZeroServeEndpoints" if ready else ("ZeroServeEndpoints" if state.ever_ready else "Initializing")
        generation = svc["metadata"].get("generation", 1)
        status: dict[str, Any] = {
            "activeServiceStatus": {"rayClusterName": active, "applicationStatuses": self._app_statuses(active_serve)}
            if active
            else {},
            "pendingServiceStatus": {
                "rayClusterName": pending,
                "applicationStatuses": self._app_statuses(state.serve.get(pending)),
            }
            if pending
            else {},
            "numServeEndpoints": endpoints,
            "serviceStatus": "Running" if ready else "",
            "observedGeneration": generation,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": reason,
                    "message": ""
                    if ready
                    else (
                        "Serve applications are not ready"
                        if active or state.serve.get(pending)
                        else "waiting for the RayCluster to be ready"
                    ),
                    "observedGeneration": generation,
                },
                {
                    "type": "UpgradeInProgress",
                    "status": "True" if (active and pending) else "False",
                    "reason": "BothActivePendingClustersExist" if (active and pending) else "NoPendingCluster",
                    "message": "",
                    "observedGeneration": generation,
                },
            ],
        }
        # Only settle on the new generation's status once its config has been sent to the active cluster.
        if active and state.deployed_hash.get(active) != short_hash((svc.get("spec") or {}).get("serveConfigV2") or ""):
            status["observedGeneration"] = max(int(generation) - 1, 0) if generation > 1 else generation
        stamp = now_iso()

        def apply(o: dict[str, Any]) -> None:
            old = o.get("status") or {}
            comparable = {k: v for k, v in old.items() if k != "lastUpdateTime"}
            stamp_transitions(status["conditions"], old, stamp)
            if comparable != status:
                o["status"] = {**status, "lastUpdateTime": stamp}

        self.store.mutate(RAYSERVICES, ns, name, apply)
