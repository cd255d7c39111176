"""KubeRay on GKE: manifests, status semantics, hooks, triggers and operators.

Importing this package is cheap (no kubernetes, ray or google imports): DAG files import the
operators from `tpuflow.kuberay.operators`, which load their hooks inside execute().
"""

from __future__ import annotations

from tpuflow.labels import LABEL_PREFIX, MANAGED_BY, RUN_KEY_LABEL
from tpuflow.labels import SPEC_HASH_ANNOTATION as SPEC_HASH

GROUP = "ray.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
RAYCLUSTERS = "rayclusters"
RAYSERVICES = "rayservices"
# KubeRay's own labels: on every pod of a RayCluster, the cluster's name; on the RayClusters it makes for a
# RayService (or RayJob), the kind and name they come from.
CLUSTER_LABEL = "ray.io/cluster"
ORIGIN_CRD_LABEL = "ray.io/originated-from-crd"
ORIGIN_NAME_LABEL = "ray.io/originated-from-cr-name"
# Each kind (name, plural, manifest builder, verdict, diagnosis) is one class in tpuflow.kuberay.kinds.

# Names the operators need when their module is imported (argument defaults, label keys); the
# manifest builders that use them (tpuflow.kuberay.manifests) load only when a manifest is built.
# The label keys live in tpuflow.labels (one home for every label key and rule); re-exported here.
DEFAULT_RAY_VERSION = "2.60.0"
# RayService: "None" updates serveConfigV2 in place on the running cluster. "NewCluster" and the
# incremental upgrade bring up a second RayCluster first, i.e. a second TPU slice.
DEFAULT_UPGRADE_STRATEGY = "None"

__all__ = [
    "API_VERSION",
    "CLUSTER_LABEL",
    "DEFAULT_RAY_VERSION",
    "DEFAULT_UPGRADE_STRATEGY",
    "GROUP",
    "LABEL_PREFIX",
    "RUN_KEY_LABEL",
    "MANAGED_BY",
    "ORIGIN_CRD_LABEL",
    "ORIGIN_NAME_LABEL",
    "RAYCLUSTERS",
    "RAYSERVICES",
    "SPEC_HASH",
    "VERSION",
]
