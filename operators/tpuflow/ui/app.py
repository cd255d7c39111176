"""Pages the tpuflow plugin adds to the Airflow API server (mounted at /tpuflow).

- /tpuflow/outputs/<dag_id>/<date>/...: a run's outputs (data, checkpoints, eval, logs,
  report.json) under the output root, a local folder or gs://. The "Outputs" extra link points here
  for local runs (the Airflow UI shows only http(s) or same-origin links, so a file:// link would
  not appear at all) and for gs:// under a GCS emulator, which the Cloud console cannot show.
- /tpuflow/clusters: the local Ray clusters and their dashboard URLs (ports are chosen at run
  time, and keep_endpoint leaves a cluster up after its run).
- /tpuflow/ledger: chip-hours per run (the chip_ledger tasks' XComs), with money where prices are set.

Outputs are served inline only when a browser cannot run them (text, PNG/JPEG); HTML, SVG, parquet and
everything else come as downloads. Every response says nosniff and carries a Content-Security-Policy
that allows no script.

Both need a logged-in Airflow user (the UI's cookie or a bearer token); outputs also need read
access to the DAG. Imports of Airflow's API internals happen per request, not at plugin load.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from tpuflow import paths
from tpuflow.cost.ledger import LEDGER_TASK_ID
from tpuflow.output_links import LOCAL_OUTPUTS_ROUTE
from tpuflow.storage import gcs_client, split_gs_uri
from tpuflow.ui.ledger import goodput_chart_svg, ledger_chart_svg, ledger_rows, ledger_table, timelines_html

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

    await _authorize(request, dag_id)
    root = paths.output_root()
    if root.startswith("gs://"):
        return await run_in_threadpool(_bucket_outputs, root, dag_id, rest)
    return _folder_outputs(Path(root).resolve(), dag_id, rest)


# What the page shows in the browser: plain text and raster images, nothing a browser runs. Anything
# else (HTML, SVG, parquet, checkpoints...) is a download: an output is written by Ray jobs and bucket
# users, and shown inline on the Airflow origin it could act as the viewer (stored XSS).
_TEXT_SUFFIXES = (".log", ".txt", ".json", ".jsonl", ".yaml", ".yml", ".csv", ".md", ".out", ".err")
_IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
_DOWNLOAD = "application/octet-stream"
# Every response: no MIME sniffing; the pages' own inline style and same-origin images, nothing else
# (no script, no frame, no form target, no plugin); files are sandboxed besides.
_PAGE_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
_FILE_CSP = f"{_PAGE_CSP}; sandbox"


@app.middleware("http")
async def _safe_headers(request: Request, call_next: Any) -> Response:
    response = await call_next(request)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers.setdefault("Content-Security-Policy", _PAGE_CSP)
    return response


def serving(name: str) -> tuple[str, dict[str, str]]:
    """How one output file is served: its media type and headers (inline only for the allowlist)."""
    suffix = Path(name).suffix.lower()
    headers = {"Content-Security-Policy": _FILE_CSP, "X-Content-Type-Options": "nosniff"}
    if suffix in _TEXT_SUFFIXES:
        return "text/plain; charset=utf-8", {**headers, "Content-Disposition": "inline"}
    if suffix in _IMAGE_TYPES:
        return _IMAGE_TYPES[suffix], {**headers, "Content-Disposition": "inline"}
    filename = Path(name).name
    ascii_name = "".join(c if c.isascii() and c.isprintable() and c not in '"\\;' else "_" for c in filename)
    disposition = f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}"
    return _DOWNLOAD, {**headers, "Content-Disposition": disposition}


def _listing(shown: str, location: str, parent: str | None, entries: list[tuple[str, str, int | None]]) -> HTMLResponse:
    """One folder of outputs: entries are (name, path relative to the root, size or None for a folder)."""

    rows = [
        f"<tr><td><a href='{LOCAL_OUTPUTS_ROUTE}/{quote(rel)}'>{html.escape(name)}{'' if size is not None else '/'}"
        f"</a></td><td>{'folder' if size is None else f'{size:,} B'}</td></tr>"
        for name, rel, size in sorted(entries, key=lambda e: (e[2] is not None, e[0]))
    ]
    up = f"<p><a href='{LOCAL_OUTPUTS_ROUTE}/{quote(parent)}'>..</a></p>" if parent else ""
    table = "".join(rows) or "<tr><td>(empty)</td></tr>"
    body = f"<p><code>{html.escape(location)}</code></p>{up}<table>{table}</table>"
    return HTMLResponse(_page(f"Outputs: {shown}", body))


def _folder_outputs(root: Path, dag_id: str, rest: str) -> Response:
    target = (root / dag_id / rest).resolve()
    if not target.is_relative_to(root / dag_id) or not target.exists():
        raise HTTPException(status_code=404, detail="no such output")
    if target.is_file():
        media_type, headers = serving(target.name)
        return FileResponse(target, media_type=media_type, headers=headers)
    entries = [
        (c.name, c.relative_to(root).as_posix(), c.stat().st_size if c.is_file() else None) for c in target.iterdir()
    ]
    parent = target.parent.relative_to(root).as_posix() if target != root / dag_id else None
    return _listing(target.relative_to(root).as_posix(), str(target), parent, entries)


_CHUNK = 1 << 20


def _bucket_outputs(root: str, dag_id: str, rest: str) -> Response:
    """The same page for a gs:// output root, read with the Airflow side's storage client (the
    connection's credentials, or the emulator). Runs in a worker thread: the client blocks."""

    parts = [p for p in rest.split("/") if p]
    if any(p in (".", "..") for p in parts) or "/" in dag_id or dag_id in (".", ".."):
        raise HTTPException(status_code=404, detail="no such output")
    bucket_name, prefix = split_gs_uri(root, "output_root")
    relative = "/".join([dag_id, *parts])
    name = f"{prefix}/{relative}".lstrip("/")
    bucket = gcs_client().bucket(bucket_name)
    blob = bucket.get_blob(name) if parts else None
    if blob is not None:

        def chunks() -> Iterator[bytes]:
            with blob.open("rb", chunk_size=_CHUNK) as f:
                while data := f.read(_CHUNK):
                    yield data

        media_type, headers = serving(name)
        return StreamingResponse(
            chunks(), media_type=media_type, headers={**headers, "Content-Length": str(blob.size or 0)}
        )
    listed = bucket.list_blobs(prefix=name + "/", delimiter="/")
    files = [(b.name.rsplit("/", 1)[-1], b.name, b.size) for b in listed if not b.name.endswith("/")]
    folders = [(p.rstrip("/").rsplit("/", 1)[-1], p.rstrip("/"), None) for p in listed.prefixes]
    if not files and not folders:
        raise HTTPException(status_code=404, detail="no such output")
    cut = len(prefix) + 1 if prefix else 0
    entries = [(n, full[cut:], size) for n, full, size in [*files, *folders]]
    parent = "/".join([dag_id, *parts[:-1]]) if parts else None
    return _listing(relative, f"gs://{bucket_name}/{name}/", parent, entries)


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

    with create_session() as session:
        rows = session.execute(
            select(XComModel.dag_id, XComModel.run_id, XComModel.value)
            .where(XComModel.task_id == LEDGER_TASK_ID, XComModel.key == "return_value")
            .order_by(XComModel.timestamp.desc())
            .limit(limit)
        ).all()
    return [
        (dag_id, run_id, XComModel.deserialize_value(SimpleNamespace(value=value))) for dag_id, run_id, value in rows
    ]


@app.get("/ledger", response_class=HTMLResponse)
async def ledger(request: Request) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    user = await _authorize(request)
    manager = get_auth_manager()
    records = [
        r for r in _ledger_records() if manager.is_authorized_dag(method="GET", details=DagDetails(id=r[0]), user=user)
    ]
    rows = ledger_rows(records)
    body = (
        "<p>What each run's TPU slices were billed: chips x (node pool deleted - created), and the part spent "
        "training. Prices come from the Variable <code>tpuflow_chip_hour_prices</code> "
        '(e.g. <code>{"v6e": 2.97}</code>); without one no money is shown. Goodput: the share of billed '
        "chip-seconds spent on steps that took the model further.</p>"
        f"{ledger_chart_svg(rows[:40])}<h2>Goodput over recent runs</h2>{goodput_chart_svg(rows[:40])}"
        f"{ledger_table(rows)}{timelines_html(rows[:10])}"
    )
    return _page("Chip-hour ledger", body)
