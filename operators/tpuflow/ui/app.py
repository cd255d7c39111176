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

Every page needs a logged-in Airflow user (the UI's cookie or a bearer token), found as Airflow's own API
routes find it. Outputs are authorized for exactly the DAG they serve: the DAG id must be one Airflow accepts
(and not "." or "..", which name the output root or above it as a folder), the auth manager is asked with the
DAG's team (Airflow's requires_access_dag), and a path is served only when it resolves inside that DAG's own
folder (no "." or ".." segment, no link out of it). The ledger lists only runs of DAGs the user may read
(the auth manager's get_authorized_dag_ids, team by team). Imports of Airflow's API internals happen per
request, not at plugin load.
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
from starlette.middleware.base import RequestResponseEndpoint

from tpuflow import paths
from tpuflow.cost.ledger import LEDGER_TASK_ID
from tpuflow.output_links import LOCAL_OUTPUTS_ROUTE
from tpuflow.storage import gcs_client, split_gs_uri
from tpuflow.ui.ledger import goodput_chart_svg, ledger_chart_svg, ledger_rows, ledger_table, timelines_html

app = FastAPI(title="tpuflow", openapi_url=None, docs_url=None, redoc_url=None)
_STYLE = "body{font-family:sans-serif;margin:1.5em}td,th{padding:.25em .8em;text-align:left}code{background:#f4f4f4}"


async def _authorize(request: Request, dag_id: str | None = None) -> Any:
    """The logged-in user (401 without one); with ``dag_id``, 403 unless the auth manager lets that user read
    the DAG, asked with the DAG's team as Airflow's own routes ask it (requires_access_dag)."""
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user, requires_access_dag

    user = await get_user(request, _oauth_token=None, bearer_credentials=await bearer_scheme(request))
    if dag_id is not None:
        # the team lookup reads the metadata DB: off the event loop, as FastAPI runs Airflow's sync dependency
        await run_in_threadpool(requires_access_dag("GET", param_dag_id=dag_id), request, user)
    return user


def _checked_dag_id(dag_id: str) -> str:
    """``dag_id`` when Airflow would accept it as a DAG id and it names one folder under the output root."""
    # the class validate_key raises; airflow.exceptions re-exports it from airflow.sdk without an explicit export
    from airflow.exceptions import AirflowException  # type: ignore[attr-defined]
    from airflow.utils.helpers import validate_key

    try:
        validate_key(dag_id)
    except (AirflowException, TypeError) as err:
        raise HTTPException(
            status_code=400,
            detail=f"dag_id {dag_id!r}: not an Airflow DAG id; use letters, digits, '-', '_' and '.' only",
        ) from err
    # Both are valid Airflow keys, but as a folder "." is the output root (every DAG's outputs), ".." above it.
    if dag_id in (".", ".."):
        raise HTTPException(status_code=404, detail="no such output")
    return dag_id


def _path_parts(rest: str) -> list[str]:
    """The path below the DAG's folder, one name per segment; "." and ".." (decoded from %2e too) refused."""
    parts = [p for p in rest.split("/") if p]
    if any(p in (".", "..") or "\x00" in p for p in parts):
        raise HTTPException(status_code=404, detail="no such output")
    return parts


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><h2>{html.escape(title)}</h2>{body}</body></html>"
    )


@app.get("/outputs/{dag_id}/{rest:path}")
async def outputs(request: Request, dag_id: str, rest: str = "") -> Response:

    dag_id = _checked_dag_id(dag_id)
    await _authorize(request, dag_id)
    parts = _path_parts(rest)
    root = paths.output_root()
    if root.startswith("gs://"):
        return await run_in_threadpool(_bucket_outputs, root, dag_id, parts)
    return await run_in_threadpool(_folder_outputs, Path(root).resolve(), dag_id, parts)


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
async def _safe_headers(request: Request, call_next: RequestResponseEndpoint) -> Response:
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


def _inside(path: Path, folder: Path) -> Path | None:
    """``path`` with its links resolved, when that exists inside ``folder``; else None."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a link loop, a name too long
        return None
    return real if real.is_relative_to(folder) and real.exists() else None


def _folder_outputs(root: Path, dag_id: str, parts: list[str]) -> Response:
    """A file or folder under ``root/dag_id``, judged after resolving links: nothing outside that folder
    (another DAG's, or anywhere else) is served, listed or sized."""
    folder = root / dag_id
    target = _inside(folder.joinpath(*parts), folder)
    if target is None:
        raise HTTPException(status_code=404, detail="no such output")
    if target.is_file():
        media_type, headers = serving(target.name)
        return FileResponse(target, media_type=media_type, headers=headers)
    entries = [
        (child.name, child.relative_to(root).as_posix(), real.stat().st_size if real.is_file() else None)
        for child in target.iterdir()
        if (real := _inside(child, folder)) is not None
    ]
    parent = target.parent.relative_to(root).as_posix() if target != folder else None
    return _listing(target.relative_to(root).as_posix(), str(target), parent, entries)


_CHUNK = 1 << 20


def _bucket_outputs(root: str, dag_id: str, parts: list[str]) -> Response:
    """The same page for a gs:// output root, read with the Airflow side's storage client (the
    connection's credentials, or the emulator). Runs in a worker thread: the client blocks."""

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


def _ledger_records(readable: set[str], limit: int = 200) -> list[tuple[str, str, object]]:
    """The newest chip_ledger XComs of the DAGs in ``readable`` (filtered in the query, as Airflow's XCom list
    filters, so another team's runs neither show nor take the page's rows)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    if not readable:
        return []
    with create_session() as session:
        rows = session.execute(
            select(XComModel.dag_id, XComModel.run_id, XComModel.value)
            .where(
                XComModel.task_id == LEDGER_TASK_ID,
                XComModel.key == "return_value",
                XComModel.dag_id.in_(readable),
            )
            .order_by(XComModel.timestamp.desc())
            .limit(limit)
        ).all()
    return [
        (dag_id, run_id, XComModel.deserialize_value(SimpleNamespace(value=value))) for dag_id, run_id, value in rows
    ]


@app.get("/ledger", response_class=HTMLResponse)
async def ledger(request: Request) -> str:
    from airflow.api_fastapi.app import get_auth_manager

    user = await _authorize(request)
    # each DAG asked with its own team, as Airflow's readable-DAG filters ask (ReadableXComFilterDep)
    readable = await run_in_threadpool(lambda: get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))
    rows = ledger_rows(await run_in_threadpool(_ledger_records, readable))
    body = (
        "<p>What each run's TPU slices were billed: chips x (node pool deleted - created), and the part spent "
        "training. Prices come from the Variable <code>tpuflow_chip_hour_prices</code> "
        '(e.g. <code>{"v6e": 2.97}</code>); without one no money is shown. Goodput: the share of billed '
        "chip-seconds spent on steps that took the model further.</p>"
        f"{ledger_chart_svg(rows[:40])}<h2>Goodput over recent runs</h2>{goodput_chart_svg(rows[:40])}"
        f"{ledger_table(rows)}{timelines_html(rows[:10])}"
    )
    return _page("Chip-hour ledger", body)
