"""The outputs page never lets an output act in the viewer's browser: anything a Ray job or a bucket user
wrote is served inline only when a browser cannot run it (text, PNG), everything else (HTML, SVG,
parquet, unknown types) as a download; every response says nosniff and carries a script-free CSP.
Login and DAG access are checked by the real-Airflow tests (tests/airflow_services)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

DAG_ID, DATE = "tpu_llm_pipeline_local", "2026-11-05"
XSS = "<script>document.title='owned'</script>"
FILES = {
    "report.json": '{"accuracy": 1.0}',
    "logs/train-jax.log": "[train_jax] step 1\n",
    "eval/plot.png": b"\x89PNG\r\n\x1a\n fake",
    "eval/page.html": f"<html><body>{XSS}</body></html>",
    "eval/PAGE.HTM": f"<html>{XSS}</html>",
    "eval/chart.svg": f'<svg xmlns="http://www.w3.org/2000/svg">{XSS}</svg>',
    "data/train/part-0.parquet": b"PAR1 not really",
    "eval/no-suffix": XSS,
    'eval/we"ird;name.xhtml': XSS,
}


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    from tpuflow.ui import app as ui

    async def anyone(request: Any, dag_id: str | None = None) -> None:
        return None

    monkeypatch.setattr(ui, "_authorize", anyone)
    monkeypatch.setenv("TPUFLOW_OUTPUT_ROOT", str(tmp_path))
    for name, content in FILES.items():
        path = tmp_path / DAG_ID / DATE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    airflow_api = FastAPI()  # mounted as the API server mounts the plugin (plugins/tpuflow_plugin.py)
    airflow_api.mount("/tpuflow", ui.app)
    return TestClient(airflow_api)


def _get(client: TestClient, name: str) -> Any:
    from urllib.parse import quote

    response = client.get(f"/tpuflow/outputs/{DAG_ID}/{DATE}/{quote(name)}")
    assert response.status_code == 200, (name, response.text)
    return response


def _assert_locked_down(response: Any) -> None:
    assert response.headers["x-content-type-options"] == "nosniff"
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "unsafe-eval" not in csp


@pytest.mark.parametrize(
    "name", ["eval/page.html", "eval/PAGE.HTM", "eval/chart.svg", "eval/no-suffix", 'eval/we"ird;name.xhtml']
)
def test_markup_is_a_download_never_a_page(client: TestClient, name: str) -> None:
    response = _get(client, name)
    assert response.headers["content-type"] == "application/octet-stream"
    disposition = response.headers["content-disposition"]
    assert disposition.startswith("attachment;"), disposition
    if "ird" in name:  # a quote or a semicolon in the name cannot break out of the header's value
        assert disposition.startswith('attachment; filename="we_ird_name.xhtml"; filename*='), disposition
    _assert_locked_down(response)
    assert XSS in response.text  # served as it is, byte for byte, only never rendered


def test_parquet_is_a_download(client: TestClient) -> None:
    response = _get(client, "data/train/part-0.parquet")
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"].startswith('attachment; filename="part-0.parquet"')
    _assert_locked_down(response)


@pytest.mark.parametrize(
    ("name", "media_type"),
    [("report.json", "text/plain"), ("logs/train-jax.log", "text/plain"), ("eval/plot.png", "image/png")],
)
def test_text_and_png_are_shown_inline(client: TestClient, name: str, media_type: str) -> None:
    response = _get(client, name)
    assert response.headers["content-type"].startswith(media_type)
    assert response.headers["content-disposition"] == "inline"
    _assert_locked_down(response)


def test_listing_and_errors_carry_the_same_headers(client: TestClient) -> None:
    listing = client.get(f"/tpuflow/outputs/{DAG_ID}/{DATE}")
    assert listing.status_code == 200 and "report.json" in listing.text
    _assert_locked_down(listing)
    missing = client.get(f"/tpuflow/outputs/{DAG_ID}/{DATE}/nope.html")
    assert missing.status_code == 404
    _assert_locked_down(missing)
