"""Pages the tpuflow plugin adds to the Airflow API server (mounted at /tpuflow).

- /tpuflow/outputs/<dag_id>/<date>/...: a local run's outputs (data, checkpoints, eval, logs,
  report.json). The "Outputs" extra link points here for local runs: the Airflow UI shows only
  http(s) or same-origin links, so a file:// link would not appear at all.
- /tpuflow/clusters: the local Ray clusters and their dashboard URLs (ports are chosen at run
  time, and keep_endpoint leaves a cluster up after its run).
- /tpuflow/ledger: chip-hours per run (the chip_ledger tasks' XComs), with money where prices are set.

Both need a logged-in Airflow user (the UI's cookie or a bearer token); outputs also need read
access to the DAG. Imports of Airflow's API internals happen per request, not at plugin load.
"""

from __future__ import annotations

import html
import mimetypes
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

app = FastAPI(title="tpuflow", openapi_url=None, docs_url=None, redoc_url=None)
_STYLE = "body{font-family:sans-serif;margin:1.5em}td,th{padding:.25em .8em;text-align:left}code{background:#f4f4f4}"


async def _authorize(request: Request, dag_id: str | None = None) -> Any:
    """The logged-in user (401 without one; 403 without read access to ``dag_id``)."""
    from airflow.api_fastapi.app import get_auth_manager

    header = request.headers.get("authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else request.cookies.get("_token")
    if not token:
        raise HTTPException(status_code=401, detail="Not authenticated: log in to Airflow first")
    manager = get_auth_manager()
    try:
        user = await manager.get_user_from_token(token)
    except Exception as err:  # expired or invalid token
        raise HTTPException(status_code=401, detail="Not authenticated") from err
    if dag_id is not None:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

        if not manager.is_authorized_dag(method="GET", details=DagDetails(id=dag_id), user=user):
            raise HTTPException(status_code=403, detail=f"no read access to DAG {dag_id}")
    return user


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><h2>{html.escape(title)}</h2>{body}</body></html>"
    )


@app.get("/outputs/{dag_id}/{rest:path}")
async def outputs(request: Request, dag_id: str, rest: str = "") -> Response:
    from tpuflow.output_links import LOCAL_OUTPUTS_ROUTE, output_root

    await _authorize(request, dag_id)
    root = output_root().resolve()
    target = (root / dag_id / rest).resolve()
    if not target.is_relative_to(root / dag_id) or not target.exists():
        raise HTTPException(status_code=404, detail="no such output")
    if target.is_file():
        kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if target.suffix in (".log", ".txt", ".json", ".jsonl", ".yaml", ".csv", ".md"):
            kind = "text/plain; charset=utf-8"
        return FileResponse(target, media_type=kind, content_disposition_type="inline")
    rows = []
    for child in sorted(target.iterdir(), key=lambda p: (p.is_file(), p.name)):
        rel = quote(child.relative_to(root).as_posix())
        size = f"{child.stat().st_size:,} B" if child.is_file() else "folder"
        rows.append(
            f"<tr><td><a href='{LOCAL_OUTPUTS_ROUTE}/{rel}'>{html.escape(child.name)}"
            f"{'' if child.is_file() else '/'}</a></td><td>{size}</td></tr>"
        )
    parent = target.parent.relative_to(root).as_posix() if target != root / dag_id else None
    up = f"<p><a href='{LOCAL_OUTPUTS_ROUTE}/{quote(parent)}'>..</a></p>" if parent else ""
    body = f"<p><code>{html.escape(str(target))}</code></p>{up}<table>{''.join(rows) or '<tr><td>(empty)</td></tr>'}</table>"
    return HTMLResponse(_page(f"Outputs: {target.relative_to(root).as_posix()}", body))


def local_clusters() -> list[dict[str, Any]]:
    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster, default_base_dir

    rows = []
    for state in sorted(default_base_dir().glob(f"*/{STATE_FILE}")):
        try:
            cluster = LocalRayCluster.load(state.parent)
        except (OSError, ValueError, TypeError):
            continue
        shape = cluster.slice or {}
        rows.append(
            {
                "name": cluster.name,
                "alive": cluster.is_alive(),
                "slice": f"{shape.get('generation', '')} {shape.get('topology', '')}".strip(),
                "dashboard_url": cluster.dashboard_url,
                "serve_url": cluster.serve_url,
            }
        )
    return rows


@app.get("/clusters", response_class=HTMLResponse)
async def clusters(request: Request) -> str:
    from tpuflow.local.cluster import default_base_dir

    await _authorize(request)
    rows = (
        "".join(
            f"<tr><td>{html.escape(r['name'])}</td><td>{'running' if r['alive'] else 'dead (tpuflow local down cleans it)'}"
            f"</td><td>{html.escape(r['slice'])}</td><td><a href='{html.escape(r['dashboard_url'])}' target='_blank'>"
            f"{html.escape(r['dashboard_url'])}</a></td><td>{html.escape(r['serve_url'])}</td></tr>"
            for r in local_clusters()
        )
        or "<tr><td colspan=5>No local Ray clusters (a run starts one; keep_endpoint keeps it after the run).</td></tr>"
    )
    body = (
        f"<p>State under <code>{html.escape(str(default_base_dir()))}</code>; stop one with "
        "<code>tpuflow local down --name NAME</code>.</p><table><tr><th>name</th><th>state</th><th>slice</th>"
        f"<th>Ray dashboard</th><th>Serve</th></tr>{rows}</table>"
    )
    return _page("Local Ray clusters", body)


def _ledger_records(limit: int = 200) -> list[tuple[str, str, object]]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select
    from tpuflow.cost.ledger import LEDGER_TASK_ID

    with create_session() as session:
        rows = session.execute(
            select(XComModel.dag_id, XComModel.run_id, XComModel.value)
            .where(XComModel.task_id == LEDGER_TASK_ID, XComModel.key == "return_value")
            .order_by(XComModel.timestamp.desc())
            .limit(limit)
        ).all()
    return [(dag_id, run_id, XComModel.deserialize_value(SimpleNamespace(value=value))) for dag_id, run_id, value in rows]


@app.get("/ledger", response_class=HTMLResponse)
async def ledger(request: Request) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    from tpuflow.ui.ledger import ledger_chart_svg, ledger_rows, ledger_table

    user = await _authorize(request)
    manager = get_auth_manager()
    records = [
        r for r in _ledger_records() if manager.is_authorized_dag(method="GET", details=DagDetails(id=r[0]), user=user)
    ]
    rows = ledger_rows(records)
    body = (
        "<p>What each run's TPU slices were billed: chips x (node pool deleted - created), and the part spent "
        "training. Prices come from the Variable <code>tpuflow_chip_hour_prices</code> "
        '(e.g. <code>{"v6e": 2.97}</code>); without one no money is shown.</p>'
        f"{ledger_chart_svg(rows[:40])}{ledger_table(rows)}"
    )
    return _page("Chip-hour ledger", body)
