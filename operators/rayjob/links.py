"""Links to the Ray dashboard (the cluster and the job a task runs)."""

from __future__ import annotations

from operators.links import StoredUrlLink


class RayDashboardLink(StoredUrlLink):
    name = "Ray Dashboard"
    key = "ray_dashboard"


class RayJobLink(StoredUrlLink):
    name = "Ray Job"
    key = "ray_job"
