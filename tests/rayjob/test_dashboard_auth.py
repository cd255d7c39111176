"""Both product hooks reach a token-authenticated dashboard (RAY_AUTH_MODE=token) through Ray's own clients.

Ray's JobSubmissionClient and ServeSubmissionClient send the headers they are given and add their own
token only when none is given: the bearer token of the shared base (the local cluster's token file)
authenticates both, sync and async; without it the dashboard refuses them.
"""

from __future__ import annotations

import asyncio

import pytest

from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.serve.hooks import RayServeHook

pytestmark = pytest.mark.slow


def test_job_and_serve_hooks_authenticate_with_the_clusters_token(slice_cluster) -> None:
    info = slice_cluster.connection_info()
    jobs, serve = RayJobHook(cluster=info), RayServeHook(cluster=info)
    assert jobs.headers() == serve.headers() == slice_cluster.auth_headers() != {}

    assert isinstance(jobs.find_jobs("tpuflow-no-such-task"), list)
    assert asyncio.run(jobs.aget_job_info("tpuflow-no-such-task")) is None  # 404 on the async side too
    details = serve.get_serve_details()
    assert isinstance(details.get("applications", {}), dict)
    assert asyncio.run(serve.aget_serve_details()).get("applications", {}) == details.get("applications", {})

    anonymous = {k: v for k, v in info.items() if k != "auth_token_path"}
    with pytest.raises(Exception, match="(?i)auth"):
        RayServeHook(cluster=anonymous).get_serve_details()
    with pytest.raises(Exception, match="401"):
        asyncio.run(RayServeHook(cluster=anonymous).aget_serve_details())
