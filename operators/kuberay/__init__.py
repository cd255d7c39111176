"""KubeRay on GKE: manifests, status semantics, hooks, triggers and operators.

Importing this package is cheap (no kubernetes, ray or google imports): DAG files import the
operators from `operators.kuberay.operators`, which load their hooks inside execute().
"""

from __future__ import annotations

GROUP = "ray.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
RAYCLUSTERS = "rayclusters"
RAYSERVICES = "rayservices"
KIND_BY_PLURAL = {RAYCLUSTERS: "RayCluster", RAYSERVICES: "RayService"}

__all__ = ["API_VERSION", "GROUP", "KIND_BY_PLURAL", "RAYCLUSTERS", "RAYSERVICES", "VERSION"]
