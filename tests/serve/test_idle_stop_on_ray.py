"""The idle watch on a real Ray Serve: the session's simulated-slice cluster, whose head exports Ray's metrics.

A request every 2 s keeps the endpoint; the watch ends only a whole window (plus the export margin) after the
last one, and it counts exactly the application's successful answers, never the proxy's health checks nor the
401s it gives a caller without its token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from support.airflow_context import new_run_id, task_context

pytestmark = pytest.mark.slow

APP = """
from ray import serve
from starlette.responses import PlainTextResponse


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Echo:
    async def __call__(self, request):
        if request.url.path.endswith("/deny"):  # what an app answers a caller without its token
            return PlainTextResponse("no", status_code=401)
        return "ok"


app = Echo.bind()
"""


@pytest.fixture
def cluster(slice_cluster: Any) -> Iterator[Any]:
    yield slice_cluster
    from tpuflow.serve.hooks import RayServeHook

    RayServeHook(cluster=slice_cluster.connection_info()).delete_applications()


def test_a_served_endpoint_is_kept_until_a_whole_window_passed_without_a_request(cluster: Any, tmp_path: Path) -> None:
    from tpuflow.serve.config import serve_application, serve_config
    from tpuflow.serve.hooks import RayServeHook
    from tpuflow.serve.idle import serve_activity
    from tpuflow.serve.idle_stop import RayServeWaitForIdleOperator
    from tpuflow.serve.operators import RayServeDeployOperator

    (tmp_path / "echo_app.py").write_text(APP)
    info = cluster.connection_info()
    assert info["metrics_url"].startswith("http://127.0.0.1:")
    app = serve_application(
        "echo", "echo_app:app", route_prefix="/echo", runtime_env={"working_dir": f"local://{tmp_path}"}
    )
    deploy = RayServeDeployOperator(task_id="deploy", cluster=info, serve_config=serve_config([app], http_port=cluster.serve_port),
                                    deploy_timeout=300, poll_interval=1.0, deferrable=False)  # fmt: skip
    deploy.execute(task_context(dag_id="idle_tests", run_id=new_run_id(), task_id="deploy"))
    before = serve_activity(requests.get(info["metrics_url"], timeout=30).text).requests

    sent: list[float] = []

    # ten requests, 2 s apart; the health checks and refused calls between them are not traffic
    def traffic() -> None:
        for _ in range(10):
            assert requests.get(f"{cluster.serve_url}/echo", timeout=30).text == "ok"
            requests.get(f"{cluster.serve_url}/-/healthz", timeout=30)
            assert requests.get(f"{cluster.serve_url}/echo/deny", timeout=30).status_code == 401
            sent.append(time.time())
            time.sleep(2)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        watch = RayServeWaitForIdleOperator(task_id="serve_until_idle", cluster=info, keep=True, idle_timeout_minutes=0.25,
                                            poll_interval=1.0, margin=10, deferrable=False)  # fmt: skip
        verdict = watch.execute(task_context(dag_id="idle_tests", run_id=new_run_id(), task_id="serve_until_idle"))
    finally:
        sender.join()
    assert len(sent) == 10
    assert verdict["keep"] is False and verdict["stopped"] == "idle"
    assert verdict["requests"] - before == 10  # every successful answer of the app, no health check, no 401
    refused = [line for line in requests.get(info["metrics_url"], timeout=30).text.splitlines()
               if line.startswith("ray_serve_num_http_requests") and 'status_code="401"' in line]  # fmt: skip
    assert refused and all('application="echo"' in line for line in refused)  # Ray labels them as the filter reads
    # it saw the last request (Ray exports a few seconds late), and waited the 15 s window plus the margin after it
    assert verdict["last_busy_at"] >= sent[-1]
    assert verdict["stopped_at"] - sent[-1] >= 15 + 10
    details = RayServeHook(cluster=info).get_serve_details()
    assert details["applications"]["echo"]["status"] == "RUNNING"  # deleting it is the teardowns' job
