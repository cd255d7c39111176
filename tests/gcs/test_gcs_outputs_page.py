"""A gs:// output root seen from the Airflow UI: the Outputs and Ray Job Log links of a run under a GCS
emulator lead to the tpuflow plugin's outputs page, which lists the bucket's folders and serves its
objects (the Cloud console cannot show an emulator's objects). Login and DAG access are checked by the
real-Airflow tests (tests/airflow_services); here the page's own behaviour against a real GCS server."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tpuflow.storage import write_text

DAG_ID, DATE = "tpu_llm_pipeline_local", "2026-11-05"


@pytest.fixture
def page(bucket: str, monkeypatch: pytest.MonkeyPatch) -> tuple[TestClient, str]:
    from tpuflow.ui import app as ui

    async def anyone(request: Any, dag_id: str | None = None) -> None:
        return None

    monkeypatch.setattr(ui, "_authorize", anyone)
    root = f"gs://{bucket}/runs"
    monkeypatch.setenv("TPUFLOW_OUTPUT_ROOT", root)
    run = f"{root}/{DAG_ID}/{DATE}"
    write_text(f"{run}/logs/train-jax.log", "[train_jax] step 100/100\n" * 3)
    write_text(f"{run}/eval/jax.json", '{"accuracy": 1.0}')
    write_text(f"{run}/report.json", '{"accuracy": 1.0}')
    write_text(f"{run}/eval/page.html", "<script>document.title='owned'</script>")
    write_text(f"{run}/eval/chart.svg", '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
    write_text(f"gs://{bucket}/elsewhere/secret.txt", "not under the output root")
    airflow_api = FastAPI()  # the plugin's app, mounted as the API server mounts it (plugins/tpuflow_plugin.py)
    airflow_api.mount("/tpuflow", ui.app)
    return TestClient(airflow_api), run


def test_links_under_an_emulator_open_the_plugin_page(page: tuple[TestClient, str]) -> None:
    from tpuflow.output_links import browse_url, outputs_url

    _, run = page
    assert outputs_url(f"{run}/train") == f"/tpuflow/outputs/{DAG_ID}/{DATE}/train"
    assert browse_url(f"{run}/logs/train-jax.log") == f"/tpuflow/outputs/{DAG_ID}/{DATE}/logs/train-jax.log"
    # outside the output root the console URL stays (the page serves only the root)
    assert browse_url(run.replace("/runs/", "/other/")).startswith("https://console.cloud.google.com/")


def test_plugin_page_lists_and_serves_the_buckets_outputs(page: tuple[TestClient, str]) -> None:
    from tpuflow.output_links import browse_url

    client, run = page
    log = client.get(browse_url(f"{run}/logs/train-jax.log"))
    assert log.status_code == 200 and log.text == "[train_jax] step 100/100\n" * 3
    assert log.headers["content-type"].startswith("text/plain")

    listing = client.get(f"/tpuflow/outputs/{DAG_ID}/{DATE}")
    assert listing.status_code == 200
    assert f"gs://{run.removeprefix('gs://')}/" in listing.text
    for entry in ("eval/", "logs/", "report.json"):
        assert f">{entry}</a>" in listing.text
    assert f"href='/tpuflow/outputs/{DAG_ID}/{DATE}/logs'" in listing.text
    assert f"href='/tpuflow/outputs/{DAG_ID}'" in listing.text  # the way up

    assert client.get(f"/tpuflow/outputs/{DAG_ID}/{DATE}/eval/jax.json").json() == {"accuracy": 1.0}


@pytest.mark.parametrize("path", ["2026-11-05/missing.log", "%2e%2e/%2e%2e/elsewhere/secret.txt", "../elsewhere"])
def test_plugin_page_serves_nothing_outside_the_dags_outputs(page: tuple[TestClient, str], path: str) -> None:
    client, _ = page
    response = client.get(f"/tpuflow/outputs/{DAG_ID}/{path}")
    assert response.status_code == 404 and "not under the output root" not in response.text


@pytest.mark.parametrize("name", ["eval/page.html", "eval/chart.svg"])
def test_a_buckets_markup_is_a_download_never_a_page(page: tuple[TestClient, str], name: str) -> None:
    """Anything that can write to the bucket would otherwise run script as the Airflow viewer (stored XSS)."""
    client, _ = page
    response = client.get(f"/tpuflow/outputs/{DAG_ID}/{DATE}/{name}")
    assert response.status_code == 200 and "<script>" in response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"].startswith("attachment;")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'none'" in response.headers["content-security-policy"]
    inline = client.get(f"/tpuflow/outputs/{DAG_ID}/{DATE}/eval/jax.json")
    assert inline.headers["content-disposition"] == "inline" and inline.headers["x-content-type-options"] == "nosniff"
