"""Extra links: the Ray dashboard of the cluster a task brought up, and its GKE console pages.

Each link's full URL is pushed to XCom under the link's key as soon as it is known (before any wait),
so the link works while the task is deferred and after it failed. Light imports only. Register them
with the webserver through a plugin's ``operator_extra_links`` (or the operators' own
``operator_extra_links``, which is what the serialized DAG records).
"""

from __future__ import annotations

from tpuflow.links import CONSOLE, StoredUrlLink

# The cluster's dashboard is the same link whichever backend started the cluster.
from tpuflow.ray.links import RayDashboardLink as RayDashboardLink


class GKEWorkloadsLink(StoredUrlLink):
    """GKE console Workloads page, filtered to the cluster and namespace (the provider's URL shape)."""

    name = "GKE Workloads"
    key = "gke_ray_workloads"

    format_str = (
        CONSOLE + "/kubernetes/workload/overview?project={project_id}"
        '&pageState=("savedViews":("c":%5B"gke%2F{location}%2F{cluster_name}"%5D,"n":%5B"{namespace}"%5D))'
    )


class GKERayHeadPodLink(StoredUrlLink):
    """GKE console page of the Ray head pod (events, logs, YAML)."""

    name = "GKE Ray Head Pod"
    key = "gke_ray_head_pod"

    format_str = CONSOLE + "/kubernetes/pod/{location}/{cluster_name}/{namespace}/{pod}/details?project={project_id}"
