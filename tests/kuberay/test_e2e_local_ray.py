"""End to end on real Ray: the simulated KubeRay turns a RayService into an embedded LocalRayCluster with
simulated TPU hosts (from the manifest's node selectors and numOfHosts), deploys serveConfigV2 through
the dashboard REST API, and the operators' XCom addresses reach it: a Ray job sees the slice's TPU
resources and the Serve endpoint answers. Deleting the RayService stops exactly those Ray processes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import requests
from support.airflow_context import task_context

from tpuflow.kuberay.operators import KubeRayDeleteServiceOperator, KubeRayDeployServiceOperator
from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller import KubeRayStandin, LocalRayLauncher, StaticNodePools
from tpuflow_rehearsal.standins.kubernetes_api import RAYSERVICES

HERE = Path(__file__).resolve().parent


SERVE_TASK = {"dag_id": "tpu_llm_pipeline_gke", "run_id": "manual__e2e", "task_id": "serve"}


@pytest.mark.slow
@pytest.mark.long  # the imitation's end to end; make test deploys through the real operator (tests/rehearsal/test_rehearsal.py)
def test_rayservice_on_a_real_local_ray_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tpu = TpuSlice.from_spec("tpu7x", "2x2x2")  # 2 simulated hosts, 8 logical TPU devices each
    launcher = LocalRayLauncher(tmp_path / "ray", head_cpus=1, host_cpus=1, env={"PYTHONPATH": str(HERE)}, timeout=240)
    with KubeRayStandin(
        tmp_path / "kube", launcher=launcher, node_pools=StaticNodePools([(tpu.node_selector, 2)]), interval=0.2
    ) as kube:
        for key, value in kube.connection_env("kube_standin").items():
            monkeypatch.setenv(key, value)
        echo = {"name": "echo", "import_path": "serve_echo_app:app", "route_prefix": "/"}
        serve_config = {"applications": [{**echo, "args": tpu.serve_accelerator_config()}]}
        op = KubeRayDeployServiceOperator(
            task_id="serve",
            tpu_slice=tpu,
            image="rayproject/ray:2.60.0-py311",
            serve_config=serve_config,
            kubernetes_conn_id="kube_standin",
            deferrable=False,
            poll_interval=1,
            wait_timeout=420,
        )
        payload = op.execute(task_context(**SERVE_TASK))
        assert payload["applications"] == {"echo": "RUNNING"}

        from ray.job_submission import JobStatus, JobSubmissionClient

        from tpuflow.rayjob.hooks import RayJobHook

        # Token auth is on by default: real Ray refuses the dashboard, Jobs and Serve REST without the token,
        # which the hook reads from the Secret the simulated KubeRay created.
        for path in ("/api/jobs/", "/api/serve/applications/", "/api/v0/nodes"):
            refused = requests.get(f"{payload['dashboard_url']}{path}", timeout=30)
            assert refused.status_code in (401, 403), (path, refused.status_code)
        headers = RayJobHook(cluster=payload).headers()
        assert requests.get(f"{payload['dashboard_url']}/api/jobs/", headers=headers, timeout=30).ok

        jobs = JobSubmissionClient(payload["dashboard_url"], headers=headers)
        job = jobs.submit_job(
            entrypoint=f"{sys.executable} -c \"import ray; ray.init(); print('TPU', "
            "ray.cluster_resources().get('TPU'))\""
        )
        deadline = time.time() + 180
        while jobs.get_job_status(job) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            assert time.time() < deadline, jobs.get_job_logs(job)
            time.sleep(1)
        assert jobs.get_job_status(job) == JobStatus.SUCCEEDED, jobs.get_job_logs(job)
        assert "TPU 16.0" in jobs.get_job_logs(job)

        assert requests.get(payload["serve_url"], timeout=30).text == "tpuflow-serve-ok"

        cluster = kube.controller.handle_for("default", payload["ray_cluster_name"])
        assert cluster is not None
        local = cluster.cluster  # type: ignore[attr-defined]
        deleted = KubeRayDeleteServiceOperator(
            task_id="delete", name=payload["name"], kubernetes_conn_id="kube_standin", poll_interval=1, wait_timeout=120
        ).execute(task_context(**SERVE_TASK))
        assert deleted["deleted"] and kube.store.list(RAYSERVICES) == []
        deadline = time.time() + 60
        while local.is_alive() and time.time() < deadline:
            time.sleep(0.5)
        assert not local.is_alive()
