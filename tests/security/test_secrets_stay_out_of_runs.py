"""No secret in a run: a DAG run on the Kubernetes stand-in (real task runner and inline triggerer, simulated
KubeRay with token auth, fake Ray launcher) whose tasks authenticate to Ray with the token from the Secret;
afterwards no task log, XCom or rendered template holds the Ray token or the stand-in's API token."""

from __future__ import annotations

import base64
import json
import sqlite3
import subprocess
import textwrap
from pathlib import Path

import pytest
from support.kuberay_standin import one_slice_kuberay
from support.standin_dag_run import dagtest_command, standin_airflow_home

from tpuflow_rehearsal.standins.kubernetes_api import CORE_TYPES

REPO = Path(__file__).resolve().parents[2]
SECRETS = CORE_TYPES["secrets"]

DAG = textwrap.dedent("""
    from airflow.sdk import DAG, task
    from tpuflow.kuberay.operators import KubeRayCreateClusterOperator, KubeRayDeleteClusterOperator
    from tpuflow.tpu import TpuSlice

    COMMON = dict(kubernetes_conn_id="kube_standin", deferrable=True, poll_interval=0.2)

    with DAG("secrets_standin", schedule=None, render_template_as_native_obj=True) as dag:
        create = KubeRayCreateClusterOperator(task_id="ray_cluster", tpu_slice=TpuSlice.from_spec("v6e", "2x2"),
                                              image="rayproject/ray:2.60.0-py311", wait_timeout=60, **COMMON)

        @task
        def authenticate(cluster):
            from tpuflow.rayjob.hooks import RayJobHook

            headers = RayJobHook(cluster=cluster).headers()
            assert headers["Authorization"].startswith("Bearer ") and len(headers["Authorization"]) > 40
            print("bearer header ready for", cluster["dashboard_url"])
            return sorted(headers)

        delete = KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="ray_cluster",
                                              wait_timeout=60, **COMMON)
        create >> authenticate(create.output) >> delete
""")


@pytest.mark.slow
def test_no_token_in_logs_xcom_or_rendered_templates(tmp_path: Path) -> None:
    with one_slice_kuberay(tmp_path / "kube") as kube:
        tokens: set[str] = {str(kube.api.token)}
        seen = kube.store.changed

        def remember_secrets() -> None:
            for secret in kube.store.list(SECRETS):
                tokens.update(base64.b64decode(v).decode() for v in (secret.get("data") or {}).values())

        home = tmp_path / "airflow"
        dag_file, env = standin_airflow_home(home, kube.connection_env("kube_standin"), "secrets_standin", DAG)
        # The Secret goes with its RayCluster: catch its token while the run is going.
        out_path = tmp_path / "run.out"
        with (
            out_path.open("w") as out,
            subprocess.Popen(
                dagtest_command(dag_file, "secrets_standin"),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            ) as proc,
        ):
            while proc.poll() is None:
                remember_secrets()
                with seen:
                    seen.wait(0.2)
        remember_secrets()
        output = out_path.read_text(errors="replace")

    lines = [line for line in output.splitlines() if line.startswith("DAGTEST_RESULT ")]
    assert lines, output[-5000:]
    result = json.loads(lines[-1].removeprefix("DAGTEST_RESULT "))
    assert result["states"] == {
        "ray_cluster": "success",
        "authenticate": "success",
        "delete_ray_cluster": "success",
    }, output[-5000:]
    assert result["xcoms"]["authenticate.return_value"] == ["Authorization"]
    ray_tokens = tokens - {str(kube.api.token)}
    assert ray_tokens, "the simulated KubeRay created no token Secret"

    with sqlite3.connect(home / "airflow.db") as db:
        rendered = [row[0] for row in db.execute("SELECT rendered_fields FROM rendered_task_instance_fields")]
    assert rendered, "no rendered templates recorded"
    logs = [p.read_text(errors="replace") for p in (home / "logs").rglob("*") if p.is_file()]
    haystacks = {"run output": output, "xcom": json.dumps(result["xcoms"]), "rendered": json.dumps(rendered)}
    haystacks.update({f"log {i}": text for i, text in enumerate(logs)})
    leaks = [(where, token[:6]) for where, text in haystacks.items() for token in tokens if token in text]
    assert leaks == [], leaks
