"""Cloud console links for node pools, in the style of the google provider's KubernetesEngine links.

The full URL is stored in XCom under the link's key as soon as the pool name is known, so the link
works while the task is still provisioning or deferred (and after it failed). Light imports only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from tpuflow.links import StoredUrlLink

if TYPE_CHECKING:
    from airflow.sdk import Context

CONSOLE = "https://console.cloud.google.com"


class _StoredUrlLink(StoredUrlLink):
    format_str: ClassVar[str]

    @classmethod
    def url(cls, **params: Any) -> str:
        return CONSOLE + cls.format_str.format(**params)

    @classmethod
    def persist(cls, context: Context, **params: Any) -> str:
        return cls.persist_url(context, cls.url(**params))


class GKENodePoolLink(_StoredUrlLink):
    """The (first) node pool the task created or adopted."""

    name = "GKE Node Pool"
    key = "gke_node_pool"
    format_str = "/kubernetes/nodepool/{location}/{cluster_name}/{node_pool_name}?project={project_id}"


class GKEClusterNodesLink(_StoredUrlLink):
    """The cluster's Nodes tab: every pool of a multi-slice request."""

    name = "GKE Cluster Nodes"
    key = "gke_cluster_nodes"
    format_str = "/kubernetes/clusters/details/{location}/{cluster_name}/nodes?project={project_id}"
