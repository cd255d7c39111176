"""The product hooks against a scripted dashboard (aiohttp on loopback, Ray's job REST and log tail
paths): an open hook shares one HTTP session (one kept-alive connection, the token read once), and a
job wait through RayJobHook gets the driver log from the log tail websocket, each byte once."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tpuflow.rayjob.hooks import RayJobHook
from tpuflow.rayjob.waits import wait_for_job
from tpuflow.serve.hooks import RayServeHook

LINES = [f"step {i} " + "." * 50 for i in range(40)] + ['TPUFLOW_RESULT {"steps": 40}']


class Dashboard:
    """/api/jobs/{id}, /api/jobs/{id}/logs, /api/jobs/{id}/logs/tail and /api/serve/applications/."""

    def __init__(self) -> None:
        self.peers: list[Any] = []
        self.auth: list[str] = []
        self.full_log_requests = 0
        self.tail_bytes = 0
        self.done = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/api/jobs/{sid}", self.job)
        app.router.add_get("/api/jobs/{sid}/logs", self.logs)
        app.router.add_get("/api/jobs/{sid}/logs/tail", self.tail)
        app.router.add_get("/api/serve/applications/", self.serve)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        self.auth.append(request.headers.get("Authorization", ""))
        return await handler(request)

    async def job(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "SUCCEEDED" if self.done.is_set() else "RUNNING", "message": ""})

    async def logs(self, request: web.Request) -> web.Response:
        self.full_log_requests += 1
        return web.json_response({"logs": "\n".join(LINES) + "\n"})

    async def serve(self, request: web.Request) -> web.Response:
        return web.json_response({"applications": {}})

    async def tail(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        text = "\n".join(LINES) + "\n"
        for i in range(0, len(text), 700):  # chunks that end mid-line, as Ray's 20000-character chunks may
            await ws.send_str(text[i : i + 700])
            self.tail_bytes += len(text[i : i + 700])
            await asyncio.sleep(0.01)
        self.done.set()
        return ws  # Ray returns the socket once the job ended and its log was read: a normal close


async def _serving(dashboard: Dashboard) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(dashboard.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
def token(tmp_path: Path) -> str:
    (tmp_path / "token").write_text("s3cret\n")
    return str(tmp_path / "token")


def test_an_open_hook_reuses_one_connection_and_a_closed_one_does_not(token: str) -> None:
    async def scenario() -> tuple[list[Any], list[Any], list[str], bool]:
        dashboard = Dashboard()
        runner, url = await _serving(dashboard)
        try:
            hook = RayServeHook(cluster={"dashboard_url": url, "auth_token_path": token})
            async with hook:
                for _ in range(5):
                    await hook.aget_serve_details()
                session = hook._session
            opened = list(dashboard.peers)
            dashboard.peers.clear()
            for _ in range(3):
                await hook.aget_serve_details()
            return opened, list(dashboard.peers), dashboard.auth, session is not None and session.closed
        finally:
            await runner.cleanup()

    opened, unopened, auth, closed = asyncio.run(scenario())
    assert len(opened) == 5 and len(set(opened)) == 1, "one kept-alive connection for the open hook"
    assert len(set(unopened)) == 3, "outside `async with`, each call has its own session"
    assert set(auth) == {"Bearer s3cret"}
    assert closed, "the session is closed when the wait ends"


def test_a_job_wait_through_the_hook_streams_the_log_tail_once(token: str, caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.hook_tail")
    caplog.set_level(logging.INFO, logger=log.name)

    async def scenario() -> tuple[dict[str, Any], Dashboard]:
        dashboard = Dashboard()
        runner, url = await _serving(dashboard)
        try:
            hook = RayJobHook(cluster={"dashboard_url": url, "auth_token_path": token})
            async with hook:
                event = await wait_for_job(
                    hook, "job-1", poll_interval=0.05, timeout=60, started_at=time.time(), log=log
                )
            return dict(event), dashboard
        finally:
            await runner.cleanup()

    event, dashboard = asyncio.run(scenario())
    assert event["status"] == "success" and event["result"] == {"steps": 40}
    streamed = [r.getMessage().split("[ray job] ", 1)[1] for r in caplog.records if "[ray job] " in r.getMessage()]
    assert streamed == LINES
    assert dashboard.full_log_requests == 0 and dashboard.tail_bytes == len("\n".join(LINES)) + 1
    polls = len(dashboard.peers) - 1  # every request but the tail's upgrade
    assert polls >= 3 and len(set(dashboard.peers)) <= 3, "the polls reuse the open hook's connections"
    assert json.dumps(event)  # the event stays serialisable


def test_waits_past_the_tail_limit_poll_the_whole_log_and_every_tail_is_given_back(
    token: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuflow.rayjob import hooks as hooks_mod

    log = logging.getLogger("test.hook_tail_limit")
    caplog.set_level(logging.INFO, logger=log.name)
    monkeypatch.setattr(hooks_mod, "MAX_LOG_TAILS_PER_DASHBOARD", 1)

    async def scenario() -> tuple[list[dict[str, Any]], Dashboard, dict[str, int]]:
        dashboard = Dashboard()
        runner, url = await _serving(dashboard)
        try:

            async def one(sid: str) -> dict[str, Any]:
                async with RayJobHook(cluster={"dashboard_url": url, "auth_token_path": token}) as hook:
                    return dict(
                        await wait_for_job(hook, sid, poll_interval=0.05, timeout=60, started_at=time.time(), log=log)
                    )

            events = await asyncio.gather(one("a"), one("b"))
            return events, dashboard, dict(hooks_mod._open_tails)
        finally:
            await runner.cleanup()

    events, dashboard, open_after = asyncio.run(scenario())
    assert [e["result"] for e in events] == [{"steps": 40}] * 2
    streamed = [r.getMessage().split("[ray job] ", 1)[1] for r in caplog.records if "[ray job] " in r.getMessage()]
    assert sorted(streamed) == sorted(LINES * 2), "each wait logs every line once, tail or not"
    assert dashboard.full_log_requests > 0, "the wait over the limit fetched the log instead"
    assert set(open_after.values()) == {0}
