"""Cloud console links for node pools, in the style of the google provider's KubernetesEngine links.

The full URL is stored in XCom under the link's key as soon as the pool name is known, so the link
works while the task is still provisioning or deferred (and after it failed). Light imports only.
"""

from __future__ import annotations

from tpuflow.links import CONSOLE, StoredUrlLink


class GKENodePoolLink(StoredUrlLink):
    """The (first) node pool the task created or adopted."""

    name = "GKE Node Pool"
    key = "gke_node_pool"
    format_str = CONSOLE + "/kubernetes/nodepool/{location}/{cluster_name}/{node_pool_name}?project={project_id}"


class GKEClusterNodesLink(StoredUrlLink):
    """The cluster's Nodes tab: every pool of a multi-slice request."""

    name = "GKE Cluster Nodes"
    key = "gke_cluster_nodes"
    format_str = CONSOLE + "/kubernetes/clusters/details/{location}/{cluster_name}/nodes?project={project_id}"
