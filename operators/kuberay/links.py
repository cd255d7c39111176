"""Extra links: the Ray dashboard of the cluster a task brought up, and its GKE console pages.

Each link's full URL is pushed to XCom under the link's key as soon as it is known (before any wait),
so the link works while the task is deferred and after it failed. Light imports only. Register them
with the webserver through a plugin's ``operator_extra_links`` (or the operators' own
``operator_extra_links``, which is what the serialized DAG records).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey

CONSOLE = "https://console.cloud.google.com"


class _StoredUrlLink(BaseOperatorLink):
    name: ClassVar[str]
    key: ClassVar[str]

    @property
    def xcom_key(self) -> str:
        return self.key

    @classmethod
    def persist(cls, context: Context, url: str) -> str:
        if url:
            context["ti"].xcom_push(key=cls.key, value=url)
        return url

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(key=self.xcom_key, ti_key=ti_key)
        return value if isinstance(value, str) else ""


class RayDashboardLink(_StoredUrlLink):
    """The Ray dashboard at the address the task published (see operators.kuberay.addresses)."""

    name = "Ray Dashboard"
    key = "ray_dashboard_url"


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
