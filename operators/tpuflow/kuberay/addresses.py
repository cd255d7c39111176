"""Where downstream tasks reach a ready RayCluster / RayService: the XCom payload (pure functions).

Address modes (operator argument ``address_mode``):

- ``in_cluster_dns``: ``http://<name>-head-svc.<ns>.svc.cluster.local:<port>``. Right when Airflow's
  workers run in the same Kubernetes cluster (KubernetesExecutor / in-cluster Celery workers).
- ``head_service``: the head Service's address as the API reports it: a LoadBalancer ingress if the
  Service has one, else its clusterIP, with the Service's ports (status.endpoints). On GKE a clusterIP
  is only routable inside the VPC-native cluster network. The Kubernetes stand-in reports 127.0.0.1
  and the local Ray head's real ports here, so in local runs this is the reachable address.
- ``port_forward``: ``127.0.0.1`` with the head container's ports, for Airflow outside the cluster
  with a long-lived ``kubectl port-forward svc/<name>-head-svc 8265 8000 6379 8080`` (8080: the head's
  metrics, which a kept endpoint's idle watch reads; a forward started by the task would die with it, so
  the operator does not start one).
- ``auto`` (default): ``in_cluster_dns`` when the Kubernetes hook runs in-cluster, else ``head_service``.

Every payload also carries ``in_cluster_dns`` so a task inside the cluster can always use DNS.

Services stay ClusterIP (KubeRay's default; the manifests set no serviceType), so the dashboard, the
Jobs API and the Serve endpoint are reached through the head Service (``<name>-head-svc``, or a
RayService's ``<name>-serve-svc``) from inside the cluster network, or through a port-forward.

A token-authenticated cluster (authOptions mode ``token``, the default) adds ``ray_auth``: a
*reference* to the Secret holding its Ray token (``secret_name``, ``namespace``, ``key``) and the
Kubernetes target to read it through (``kube_target``: KubeTarget.to_dict(), a connection id or a GKE
endpoint with its public CA certificate). The token itself never enters XCom; the Ray hooks read it
from the Secret when they call the dashboard (tpuflow.ray.connection).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuflow.errors import UserInputError

# The head's default ports (tpuflow.kuberay.manifests.HEAD_PORTS) load where they are used: the operators
# import check_address_mode at DAG parse time, and the manifest builders are not needed then.
ADDRESS_MODES = ("auto", "in_cluster_dns", "head_service", "port_forward")
_GCS_NAMES = ("gcs", "gcs-server")


def check_address_mode(mode: str) -> str:
    if mode not in ADDRESS_MODES:
        raise UserInputError("address_mode", mode, f"use one of {', '.join(ADDRESS_MODES)}")
    return mode


def resolve_mode(mode: str, in_cluster: bool) -> str:
    check_address_mode(mode)
    if mode == "auto":
        return "in_cluster_dns" if in_cluster else "head_service"
    return mode


def _declared_ports(cluster: Mapping[str, Any]) -> dict[str, str]:
    from tpuflow.kuberay.manifests import HEAD_PORTS

    head = (((cluster.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    containers = head.get("containers") or [{}]
    ports = {str(p["name"]): str(p["containerPort"]) for p in containers[0].get("ports") or [] if p.get("name")}
    return ports or {k: str(v) for k, v in HEAD_PORTS.items()}


def _named(ports: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if ports.get(name):
            return str(ports[name])
    return None


def _service_host(service: Mapping[str, Any] | None, cluster: Mapping[str, Any]) -> str | None:
    if service:
        for ingress in ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []:
            if ingress.get("ip") or ingress.get("hostname"):
                return str(ingress.get("ip") or ingress.get("hostname"))
        ip = (service.get("spec") or {}).get("clusterIP")
        if ip and ip != "None":
            return str(ip)
    head = (cluster.get("status") or {}).get("head") or {}
    return head.get("serviceIP") or head.get("podIP")


def _urls(host: str, ports: Mapping[str, str]) -> dict[str, str]:
    out = {}
    if _named(ports, "dashboard"):
        out["dashboard_url"] = f"http://{host}:{_named(ports, 'dashboard')}"
    if _named(ports, "serve"):
        out["serve_url"] = f"http://{host}:{_named(ports, 'serve')}"
    if _named(ports, *_GCS_NAMES):
        out["gcs_address"] = f"{host}:{_named(ports, *_GCS_NAMES)}"
    if _named(ports, "metrics"):
        out["metrics_url"] = f"http://{host}:{_named(ports, 'metrics')}/metrics"
    if _named(ports, "client"):
        out["client_address"] = f"ray://{host}:{_named(ports, 'client')}"
    return out


def auth_reference(cluster: Mapping[str, Any], target: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Where a token-authenticated RayCluster's Ray token is (never the token): None when auth is disabled."""
    from tpuflow.kuberay.manifests import AUTH_TOKEN_SECRET_KEY, auth_secret_name

    meta = cluster.get("metadata") or {}
    secret = auth_secret_name(str(meta.get("name", "")), cluster.get("spec") or {})
    if secret is None:
        return None
    return {
        "secret_name": secret,
        "namespace": meta.get("namespace", "default"),
        "key": AUTH_TOKEN_SECRET_KEY,
        "kube_target": dict(target or {}),
    }


def cluster_payload(
    cluster: Mapping[str, Any],
    head_service: Mapping[str, Any] | None,
    *,
    mode: str,
    in_cluster: bool,
    target: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The XCom value of a ready RayCluster; ``target`` (KubeTarget.to_dict()) is where its token Secret is read."""
    meta, status = cluster.get("metadata") or {}, cluster.get("status") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "default")
    svc_name = ((status.get("head") or {}).get("serviceName")) or f"{name}-head-svc"
    service_ports = {
        str(p.get("name")): str(p.get("port"))
        for p in ((head_service or {}).get("spec") or {}).get("ports") or []
        if p.get("name")
    }
    ports = {k: str(v) for k, v in (status.get("endpoints") or service_ports or _declared_ports(cluster)).items()}
    resolved = resolve_mode(mode, in_cluster)
    dns = _urls(f"{svc_name}.{namespace}.svc.cluster.local", ports)
    if resolved == "in_cluster_dns":
        chosen = dns
    elif resolved == "port_forward":
        chosen = _urls("127.0.0.1", _declared_ports(cluster))
    else:
        host = _service_host(head_service, cluster)
        if not host:
            raise ValueError(f"RayCluster {name} reports no head service address yet")
        chosen = _urls(host, ports)
    return {
        "kind": "RayCluster",
        "name": name,
        "namespace": namespace,
        **{k: chosen.get(k, "") for k in ("dashboard_url", "serve_url", "gcs_address")},
        **({k: chosen[k] for k in ("client_address", "metrics_url") if k in chosen}),
        "address_mode": resolved,
        "head_service": svc_name,
        "head_pod": (status.get("head") or {}).get("podName", ""),
        "in_cluster_dns": dns,
        **({"ray_auth": auth} if (auth := auth_reference(cluster, target)) else {}),
    }


def service_payload(
    service: Mapping[str, Any],
    cluster_payload_: Mapping[str, Any],
    serve_service: Mapping[str, Any] | None,
    *,
    mode: str,
    in_cluster: bool,
) -> dict[str, Any]:
    """The XCom value of a ready RayService: its Serve URL plus its active cluster's addresses."""
    from tpuflow.kuberay.manifests import HEAD_PORTS

    meta, status = service.get("metadata") or {}, service.get("status") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "default")
    active = status.get("activeServiceStatus") or {}
    serve_svc = f"{name}-serve-svc"
    serve_port = None
    for port in ((serve_service or {}).get("spec") or {}).get("ports") or []:
        if port.get("name") == "serve" or serve_port is None:
            serve_port = str(port.get("port"))
    dns_serve = f"http://{serve_svc}.{namespace}.svc.cluster.local:{serve_port or HEAD_PORTS['serve']}"
    resolved = resolve_mode(mode, in_cluster)
    serve_url = cluster_payload_.get("serve_url", "")
    if resolved == "in_cluster_dns":
        serve_url = dns_serve
    elif resolved == "head_service" and serve_service and serve_port:
        host = _service_host(serve_service, {})
        serve_url = f"http://{host}:{serve_port}" if host else serve_url
    apps = {app: st.get("status", "") for app, st in (active.get("applicationStatuses") or {}).items()}
    return {
        "kind": "RayService",
        "name": name,
        "namespace": namespace,
        "serve_url": serve_url,
        "dashboard_url": cluster_payload_.get("dashboard_url", ""),
        "gcs_address": cluster_payload_.get("gcs_address", ""),
        **({"metrics_url": cluster_payload_["metrics_url"]} if cluster_payload_.get("metrics_url") else {}),
        "ray_cluster_name": active.get("rayClusterName", ""),
        "applications": apps,
        "address_mode": resolved,
        "in_cluster_dns": {**dict(cluster_payload_.get("in_cluster_dns") or {}), "serve_url": dns_serve},
        **({"ray_auth": dict(cluster_payload_["ray_auth"])} if cluster_payload_.get("ray_auth") else {}),
    }
