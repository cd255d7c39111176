"""Fast checks (no Airflow started): the services' settings, the Outputs link, provider and plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuflow_rehearsal.airflow_services import SERVICE_ARGS, SERVICES, AirflowServices


def test_settings_are_local_only_and_shared_by_every_service(tmp_path: Path) -> None:
    svc = AirflowServices(work_dir=str(tmp_path), port=18080, password="pw", env={})
    env = svc.build_env(parallelism=4, use_schedule=False, unpause=False, database_url=None, extra={})
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18080/execution/"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor" and env["AIRFLOW__CORE__PARALLELISM"] == "4"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path}/home/airflow.db"
    assert env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] == "False"
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] and env["AIRFLOW__CORE__FERNET_KEY"]
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["PATH"].split(":")[0].endswith("/bin")  # children run `airflow` from the venv
    assert set(SERVICES) == {"api-server", "scheduler", "dag-processor", "triggerer"}
    # No log servers on [::]:8793/8794 (files are read directly on one machine).
    assert SERVICE_ARGS["scheduler"] == SERVICE_ARGS["triggerer"] == ["--skip-serve-logs"]


def test_shell_exports_quote_values(tmp_path: Path) -> None:
    svc = AirflowServices(work_dir=str(tmp_path), port=1, password="pw", env={"AIRFLOW_HOME": "/a b", "PATH": "/x"})
    assert svc.shell_exports() == "export AIRFLOW_HOME='/a b'"


def test_outputs_link_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuflow.output_links import outputs_url

    monkeypatch.setenv("TPUFLOW_OUTPUT_ROOT", str(tmp_path))
    assert (
        outputs_url("gs://bkt/runs/2026-11-03/train")
        == "https://console.cloud.google.com/storage/browser/bkt/runs/2026-11-03/train/"
    )
    assert outputs_url(f"{tmp_path}/dag/2026-11-03/data") == "/tpuflow/outputs/dag/2026-11-03/data"
    assert outputs_url("/elsewhere/x") == "file:///elsewhere/x"


def test_kept_driver_log_opens_in_the_ui_or_the_cloud_console(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuflow.output_links import browse_url

    monkeypatch.setenv("TPUFLOW_OUTPUT_ROOT", str(tmp_path))
    assert (
        browse_url(f"{tmp_path}/dag/2026-11-03/logs/train-jax.log")
        == "/tpuflow/outputs/dag/2026-11-03/logs/train-jax.log"
    )
    assert (
        browse_url("gs://bkt/runs/logs/train.log")
        == "https://console.cloud.google.com/storage/browser/_details/bkt/runs/logs/train.log"
    )


def test_provider_lists_every_link_class_and_the_ray_connection_type() -> None:
    from tpuflow.provider_info import get_provider_info
    from tpuflow.ui.links_catalog import link_class_paths

    info = get_provider_info()
    assert info["package-name"] == "tpuflow"
    assert sorted(info["extra-links"]) == sorted(link_class_paths())
    assert info["connection-types"][0]["connection-type"] == "ray"


def test_cli_registers_airflow_verbs() -> None:
    from tpuflow.cli import build_parser

    parser = build_parser()
    for verb in ("up", "status", "down", "env"):
        args = parser.parse_args(["airflow", verb])
        assert args.command == "airflow" and args.verb == verb


def test_ruff_airflow_rules_are_clean_on_dags_and_operators() -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    ruff = Path(sys.executable).with_name("ruff")
    out = subprocess.run(
        [str(ruff), "check", "--select", "AIR", "--no-cache", "dags", "operators", "plugins"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
