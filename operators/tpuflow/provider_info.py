"""Provider metadata (entry point `apache_airflow_provider`): the "Ray" connection type in the UI.

With this, Admin > Connections offers "Ray cluster (dashboard)" (conn_type "ray", registered by
RayJobHook; RayServeHook reads the same connections, both as ray_conn_id through their shared base
tpuflow.ray.connection.RayDashboardHook). "extra-links" only feeds `airflow providers links`;
the links themselves reach the task page through serialization (see plugins/tpuflow_plugin.py).
"""

from __future__ import annotations

from typing import Any

# Kept static: provider discovery must not import operator modules. A test checks it against
# tpuflow.ui.links_catalog (every link class the project defines).
EXTRA_LINKS = [
    "tpuflow.ray.links.RayDashboardLink",
    "tpuflow.ray.links.RayJobLink",
    "tpuflow.ray.links.RayJobLogLink",
    "tpuflow.serve.operators.RayServeEndpointLink",
    "tpuflow.output_links.OutputsLink",
    "tpuflow.gke.links.GKENodePoolLink",
    "tpuflow.gke.links.GKEClusterNodesLink",
    "tpuflow.kuberay.links.GKEWorkloadsLink",
    "tpuflow.kuberay.links.GKERayHeadPodLink",
]


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "tpuflow",
        "name": "tpuflow",
        "description": "Train and serve models with Ray on Cloud TPU slices (GKE + KubeRay), or an embedded local Ray.",
        "connection-types": [
            {
                "connection-type": "ray",
                "hook-class-name": "tpuflow.rayjob.hooks.RayJobHook",
                "hook-name": "Ray cluster (dashboard)",
            }
        ],
        "extra-links": list(EXTRA_LINKS),
    }
