"""Links to the Ray dashboard (the cluster and the job a task runs)."""

from __future__ import annotations

from tpuflow.links import StoredUrlLink


class RayDashboardLink(StoredUrlLink):
    name = "Ray Dashboard"
    key = "ray_dashboard"


class RayJobLink(StoredUrlLink):
    name = "Ray Job"
    key = "ray_job"
    format_str = "{dashboard_url}/#/jobs/{submission_id}"


class RayJobLogLink(StoredUrlLink):
    """The job's full driver log, kept under the run's storage path after the cluster is gone."""

    name = "Ray Job Log"
    key = "ray_job_log"
