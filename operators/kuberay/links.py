"""Extra links: the Ray dashboard of the cluster a task brought up, and its GKE console pages.

Each link's full URL is pushed to XCom under the link's key as soon as it is known (before any wait),
so the link works while the task is deferred and after it failed. Light imports only. Register them
with the webserver through a plugin's ``operator_extra_links`` (or the operators' own
``operator_extra_links``, which is what the serialized DAG records).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuflow.links import StoredUrlLink
from tpuflow.rayjob.links import RayDashboardLink as RayDashboardLink

CONSOLE = "https://console.cloud.google.com"


# The cluster's dashboard is the same link whichever backend started the cluster.
_StoredUrlLink = StoredUrlLink


class GKEWorkloadsLink(_StoredUrlLink):
    """GKE console Workloads page, filtered to the cluster and namespace (the provider's URL shape)."""

    name = "GKE Workloads"
    key = "gke_ray_workloads"

    @staticmethod
    def url(gke_cluster: Mapping[str, Any], namespace: str) -> str:
        return (f"{CONSOLE}/kubernetes/workload/overview?project={gke_cluster['project_id']}"
                f'&pageState=("savedViews":("c":%5B"gke%2F{gke_cluster["location"]}%2F{gke_cluster["cluster_name"]}"'
                f'%5D,"n":%5B"{namespace}"%5D))')


class GKERayHeadPodLink(_StoredUrlLink):
    """GKE console page of the Ray head pod (events, logs, YAML)."""

    name = "GKE Ray Head Pod"
    key = "gke_ray_head_pod"

    @staticmethod
    def url(gke_cluster: Mapping[str, Any], namespace: str, pod: str) -> str:
        return (f"{CONSOLE}/kubernetes/pod/{gke_cluster['location']}/{gke_cluster['cluster_name']}/{namespace}/{pod}"
                f"/details?project={gke_cluster['project_id']}")
