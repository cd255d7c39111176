"""A small page inside the Airflow UI: the local Ray clusters and where their dashboards are.

A local cluster's dashboard and Serve ports are picked at run time, and a run with
keep_endpoint leaves its cluster up after the DAG run ends; this page (a nav entry
"Ray clusters") is how a user finds them again. Served by the API server via the plugin.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

app = FastAPI(title="tpuflow", openapi_url=None, docs_url=None, redoc_url=None)


def _base_dir() -> Path:
    from operators.local.cluster import DEFAULT_BASE_DIR

    return DEFAULT_BASE_DIR


def local_clusters() -> list[dict[str, Any]]:
    from operators.local.cluster import STATE_FILE, LocalRayCluster

    rows = []
    for state in sorted(_base_dir().glob(f"*/{STATE_FILE}")):
        try:
            cluster = LocalRayCluster.load(state.parent)
        except (OSError, ValueError, TypeError):
            continue
        shape = cluster.slice or {}
        rows.append({
            "name": cluster.name,
            "alive": cluster.is_alive(),
            "slice": f"{shape.get('generation', '')} {shape.get('topology', '')}".strip(),
            "dashboard_url": cluster.dashboard_url,
            "serve_url": cluster.serve_url,
        })
    return rows


@app.get("/clusters.json")
def clusters_json() -> JSONResponse:
    return JSONResponse(local_clusters())


@app.get("/clusters", response_class=HTMLResponse)
def clusters_page() -> str:
    rows = local_clusters()
    body = "".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{'running' if r['alive'] else 'dead (tpuflow local down cleans it)'}"
        f"</td><td>{html.escape(r['slice'])}</td>"
        f"<td><a href='{html.escape(r['dashboard_url'])}' target='_blank'>{html.escape(r['dashboard_url'])}</a></td>"
        f"<td>{html.escape(r['serve_url'])}</td></tr>"
        for r in rows
    ) or "<tr><td colspan=5>No local Ray clusters (a run starts one; keep_endpoint keeps it).</td></tr>"
    return (
        "<!doctype html><html><head><title>tpuflow: local Ray clusters</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}td,th{padding:.3em .8em;text-align:left}</style></head>"
        f"<body><h2>Local Ray clusters</h2><p>under {html.escape(str(_base_dir()))}; "
        "stop one with <code>tpuflow local down --name NAME</code></p>"
        "<table><tr><th>name</th><th>state</th><th>slice</th><th>Ray dashboard</th><th>Serve</th></tr>"
        f"{body}</table></body></html>"
    )
