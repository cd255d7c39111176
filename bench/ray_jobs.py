"""The deferred Ray job wait, measured through the product's trigger against a real local cluster.

log_stream_cost — bytes fetched from the dashboard per poll for a job whose log is ~50 MB, counted on
the wire by a loopback proxy in front of the dashboard, vs the log bytes that were new (goal <= 2x).
triggerer_lag_p99_ms — event-loop lag p99 of one loop holding 200 concurrent RayJobTrigger.run() waits
(streaming their logs), vs the same probe with no waits in the same loop (goal <= 100 ms).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any
from urllib.parse import urlparse

from bench.core import JOBS, Context, Result, goal_check, measure, percentile, ratio


class CountingProxy:
    """A TCP proxy on 127.0.0.1 in front of one HTTP server, counting the bytes each request got back.

    It runs its own event loop in a thread, so the loop under measurement only does the product's work.
    """

    def __init__(self, upstream_url: str) -> None:
        u = urlparse(upstream_url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.records: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.url = ""

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def cancel_connections() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_connections(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rec: dict[str, Any] = {"request": "", "down": 0, "t": time.time()}
        self.records.append(rec)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, down: bool) -> None:
            try:
                while data := await src.read(1 << 16):
                    if down:
                        rec["down"] += len(data)
                    elif not rec["request"]:
                        rec["request"] = data.split(b"\r\n", 1)[0].decode(errors="replace")
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                try:
                    dst.close()
                except RuntimeError:
                    pass

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))


def _quiet_trigger(trigger: Any, log_path: str) -> Any:
    """Route the trigger's log lines to a file (as the triggerer routes them to the task log)."""
    logger = logging.getLogger("bench.trigger_log")
    if not logger.handlers:
        logger.addHandler(logging.FileHandler(log_path))
        logger.setLevel(logging.INFO)
        logger.propagate = False
    trigger._log = logger
    return trigger


@measure("log_stream_cost")
def log_stream_cost(ctx: Context) -> list[Result]:
    from tpuflow.rayjob.triggers import RayJobTrigger

    mb, tail_s = 50, (8 if ctx.quick else 12)
    hook = ctx.hook()
    sid = f"bench-loud-{time.time_ns() % 10**12}"
    hook.submit_job(f"python loud.py {mb} {tail_s}", sid, runtime_env={"working_dir": str(JOBS)})
    with CountingProxy(ctx.cluster().dashboard_url) as proxy:
        info = {**ctx.cluster_info(), "dashboard_url": proxy.url}
        trigger = _quiet_trigger(RayJobTrigger(sid, cluster=info, poll_interval=1.0, timeout=600),
                                 str(ctx.work / "trigger-log-stream.log"))  # fmt: skip
        started = time.perf_counter()

        async def wait() -> dict[str, Any]:
            async for event in trigger.run():
                return dict(event.payload)
            return {}

        event = asyncio.run(wait())
        wall = time.perf_counter() - started
    final_log = hook.get_job_logs(sid).encode()
    # The log requests: one per poll for a wait that downloads the log (/logs), or the log tail
    # websocket (/logs/tail), which carries each byte once. "Polls" are the job status polls.
    polls = [r for r in proxy.records if "/logs" in r["request"]]
    status_polls = [r for r in proxy.records if r["request"].split(" ")[1:2] == [f"/api/jobs/{sid}"]]
    total = sum(r["down"] for r in proxy.records)
    n = max(len(status_polls), len(polls), 1)
    per_poll, new_per_poll = total / n, len(final_log) / n
    r = ratio(per_poll, new_per_poll)
    full = sum(1 for p in polls if p["down"] >= 0.8 * len(final_log))
    ctx.log(f"{n} polls, {len(polls)} log request(s) in {wall:.1f}s, {total / 1e6:.1f} MB on the wire for a {len(final_log) / 1e6:.1f} MB log "
            f"(event {event.get('status')})")  # fmt: skip
    return [Result(
        "log_stream_cost", per_poll / 1e6, "MB/poll", new_per_poll / 1e6, r, "ratio <= 2", goal_check(r, "<=", 2.0),
        baseline_is="the log bytes that were new, per poll (final log size / polls)",
        ratio_means="bytes fetched per poll / new log bytes per poll",
        notes=f"{mb} MB written at once, then a line every 0.2 s for {tail_s} s; RayJobTrigger.run(poll_interval=1) "
              f"through a counting loopback proxy; {n} polls in {wall:.1f} s; {len(polls)} log request(s) "
              f"({', '.join(sorted({r['request'].split(' ')[1].rsplit('/', 1)[-1] for r in polls}))}), {full} of "
              f"them carried the whole log; ratio = total wire bytes / final log size (1.0 = every byte fetched once)",
        details={"polls": n, "log_requests": len(polls), "full_log_requests": full, "wire_bytes": total,
                 "log_bytes": len(final_log), "wall_s": wall,
                 "event_status": event.get("status"), "series_unit": "MB", "series_x": "poll"},
        series={"fetched per poll (MB)": [p["down"] / 1e6 for p in polls]},
    )]  # fmt: skip


async def _lag_probe(seconds: float, interval: float = 0.02) -> list[tuple[float, float]]:
    """(time offset, lag ms) samples: how late each sleep(interval) wakes up."""
    samples = []
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        expected = time.perf_counter() + interval
        await asyncio.sleep(interval)
        now = time.perf_counter()
        samples.append((now - t0, max(0.0, (now - expected) * 1000)))
    return samples


@measure("triggerer_lag_p99_ms")
def triggerer_lag_p99_ms(ctx: Context) -> list[Result]:
    from tpuflow.rayjob.triggers import RayJobTrigger

    waits, n_jobs = 200, (4 if ctx.quick else 8)
    base_s, load_s = (6, 20) if ctx.quick else (6, 30)
    hook = ctx.hook()
    sids = []
    for i in range(n_jobs):
        sid = f"bench-tick-{i}-{time.time_ns() % 10**12}"
        hook.submit_job(f"python ticker.py {base_s + load_s + 30} 0.1", sid, runtime_env={"working_dir": str(JOBS)})
        sids.append(sid)
    deadline = time.time() + 180
    while time.time() < deadline and any(hook.get_job_status(s) == "PENDING" for s in sids):
        time.sleep(0.5)
    info = ctx.cluster_info()
    log_path = str(ctx.work / "trigger-lag.log")
    events: list[dict[str, Any]] = []

    async def one(trigger: Any) -> None:
        async for event in trigger.run():
            events.append(dict(event.payload))
            return

    async def scenario() -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
        idle = await _lag_probe(base_s)
        tasks = [asyncio.create_task(one(_quiet_trigger(RayJobTrigger(sids[i % n_jobs], cluster=info), log_path)))
                 for i in range(waits)]  # fmt: skip
        try:
            loaded = await _lag_probe(load_s)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return idle, loaded

    try:
        idle, loaded = asyncio.run(scenario())
    finally:
        for s in sids:
            try:
                hook.stop_job(s)
            except Exception:  # already finished
                pass
    p99, base = percentile([x[1] for x in loaded], 99), percentile([x[1] for x in idle], 99)
    warnings = 0
    try:
        warnings = open(log_path).read().count("unreachable")
    except OSError:
        pass
    return [Result(
        "triggerer_lag_p99_ms", p99, "ms", base, ratio(p99, base), "value <= 100 ms", goal_check(p99, "<=", 100),
        baseline_is="the same lag probe in the same loop with no waits (the jobs already running)",
        notes=f"{waits} RayJobTrigger.run() waits (poll 2 s) on {n_jobs} jobs printing 10 lines/s, {load_s} s; "
              f"probe: sleep(20 ms) lateness; {warnings} 'dashboard unreachable' retries; {len(events)} early events",
        details={"p50_ms": percentile([x[1] for x in loaded], 50), "max_ms": max(x[1] for x in loaded),
                 "idle_p50_ms": percentile([x[1] for x in idle], 50), "unreachable_retries": warnings,
                 "series_unit": "loop lag (ms)", "series_x": "seconds into the load"},
        series={"200 waits": [x[1] for x in loaded], "200 waits_x": [x[0] for x in loaded]},
    )]  # fmt: skip
