"""The bench's own parts that every measure relies on: percentiles, goal checks, the byte-counting proxy."""

from __future__ import annotations

import http.server
import threading
import urllib.request
from pathlib import Path

import pytest

from bench.core import REPO, Result, goal_check, percentile, ratio
from bench.dag_parse import dag_shapes, same_shape_source
from bench.ray_jobs import CountingProxy


def test_percentile_is_nearest_rank_and_goal_checks_compare_the_right_way() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99), percentile(values, 100)) == (
        50,
        95,
        99,
        100,
    )
    assert percentile([3.0], 99) == 3.0
    assert goal_check(1.5, "<=", 1.5) is True and goal_check(1.6, "<=", 1.5) is False
    assert goal_check(0.8, ">=", 0.8) is True and goal_check(0.7, ">=", 0.8) is False
    assert goal_check(None, "<=", 1.0) is None and ratio(1.0, 0.0) is None and ratio(3.0, 2.0) == 1.5


def test_result_rows_have_the_issue_keys_and_no_nan() -> None:
    row = Result("x", float("nan"), "s", 2.0, None, "value <= 1 s", None, series={"a": [1.0]}).row()
    assert list(row)[:7] == ["name", "value", "unit", "baseline", "ratio", "goal", "met"]
    assert row["value"] is None and "series" not in row


class _Big(http.server.BaseHTTPRequestHandler):
    body = b"y" * 300_000

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def test_counting_proxy_counts_the_bytes_each_request_got() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Big)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with CountingProxy(f"http://127.0.0.1:{server.server_address[1]}") as proxy:
            for path in ("/api/jobs/a/logs", "/api/jobs/a"):
                with urllib.request.urlopen(f"{proxy.url}{path}", timeout=10) as resp:
                    assert resp.read() == _Big.body
        assert [r["request"].split()[:2] for r in proxy.records] == [
            ["GET", "/api/jobs/a/logs"],
            ["GET", "/api/jobs/a"],
        ]
        assert all(len(_Big.body) < r["down"] < len(_Big.body) + 1000 for r in proxy.records)
    finally:
        server.shutdown()


@pytest.mark.parametrize("dag_file", sorted(p.name for p in (REPO / "dags").glob("*.py")))
def test_the_parse_baseline_is_the_same_dag_by_hand(dag_file: str, tmp_path: Path) -> None:
    """dag_parse_ratio's baseline: the same task ids, setup/teardown roles, dependencies and Params."""
    shapes = dag_shapes(REPO / "dags" / dag_file)
    by_hand = tmp_path / f"by_hand_{dag_file}"
    by_hand.write_text(same_shape_source(shapes))
    assert shapes and dag_shapes(by_hand) == shapes
    assert "from tpuflow" not in by_hand.read_text() and "import tpuflow" not in by_hand.read_text(), "stock only"


class _ScriptedApi:
    """The REST calls `_scheduled_pipeline` makes, answered like Airflow's API; the run ends on the third poll."""

    def __init__(self) -> None:
        self.polls, self.posted = 0, None

    def patch(self, path: str, json: dict) -> _Answer:
        return _Answer({})

    def post(self, path: str, json: dict, **kwargs: object) -> _Answer:
        self.posted = json
        return _Answer({"dag_run_id": "r1"})

    def get(self, path: str) -> _Answer:
        if path.endswith("/taskInstances"):
            return _Answer({"task_instances": [
                {"task_id": "train", "state": "success", "queued_when": "2026-11-03T00:00:12Z",
                 "start_date": "2026-11-03T00:00:13Z", "end_date": "2026-11-03T00:01:13Z"},
                {"task_id": "prep", "state": "success", "queued_when": "2026-11-03T00:00:01Z",
                 "start_date": "2026-11-03T00:00:02Z", "end_date": "2026-11-03T00:00:10Z"},
            ]})  # fmt: skip
        self.polls += 1
        state = "success" if self.polls >= 3 else "running"
        return _Answer({"state": state, "start_date": "2026-11-03T00:00:00Z", "end_date": "2026-11-03T00:01:20Z"})


class _Answer:
    def __init__(self, body: dict, status_code: int = 200) -> None:
        self.body, self.status_code = body, status_code

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}")

    def json(self) -> dict:
        return self.body


def test_the_scheduler_pipeline_measure_times_the_run_and_each_tasks_queue_start_and_end(monkeypatch) -> None:
    import bench.pipeline as pipeline

    monkeypatch.setattr(pipeline.time, "sleep", lambda s: None)
    api = _ScriptedApi()
    wall, timeline = pipeline._scheduled_pipeline(api)
    assert wall == 80.0 and api.polls == 3
    assert list(timeline) == ["prep", "train"]  # in the order they started
    assert timeline["train"] == {"queued": 12.0, "start": 13.0, "end": 73.0}
    assert api.posted["conf"]["train_steps"] == pipeline.TRAIN_STEPS


def test_the_demo_measure_splits_its_time_outside_tasks_before_between_and_after(tmp_path: Path) -> None:
    import sqlite3
    from datetime import UTC, datetime

    import bench.pipeline as pipeline

    db = tmp_path / "airflow.db"
    with sqlite3.connect(db) as conn:  # as Airflow keeps them in SQLite: UTC, no offset; one task still running
        conn.execute("CREATE TABLE task_instance (task_id TEXT, start_date TEXT, end_date TEXT)")
        conn.executemany(
            "INSERT INTO task_instance VALUES (?, ?, ?)",
            [
                ("prep", "2026-11-03 00:00:10", "2026-11-03 00:00:14"),
                ("preflight", "2026-11-03 00:00:11", "2026-11-03 00:00:16"),  # beside prep: no gap counted twice
                ("train", "2026-11-03 00:00:17.5", "2026-11-03 00:00:30"),
                ("stop", "2026-11-03 00:00:29", None),
            ],
        )
    spans = pipeline._task_spans(db)
    assert [task for task, _, _ in spans] == ["prep", "preflight", "train"]
    assert spans[0][1] == datetime(2026, 11, 3, 0, 0, 10, tzinfo=UTC).timestamp()  # read as UTC, as time.time() is
    started = spans[0][1] - 6.0
    assert spans[2][1] - spans[0][1] == 7.5
    assert pipeline._outside_tasks(spans, started, spans[2][2] + 2.0) == {
        "before_first_task": 6.0,
        "between_tasks": 1.5,
        "after_last_task": 2.0,
    }


def test_job_end_delays_count_only_tasks_that_deferred_before_their_job_ended() -> None:
    from bench.pipeline import _split_by_deferral

    end_ms = 1_000_000_000_000  # the jobs' end, Ray's milliseconds
    ids = ["r-watched", "r-late", "r-never-seen", "r-failed", "r-no-job", "r-unfinished"]
    ended = "2001-09-09T01:46:41.500000Z"  # 1.5 s after end_ms
    tis = {rid: {"state": "success", "end_date": ended} for rid in ids[:5]}
    tis["r-failed"]["state"] = "failed"
    job_ends = {f"python ticker.py 2 0.5 {rid} 1e9": end_ms for rid in ids if rid != "r-no-job"}
    deferred_at = {"r-watched": end_ms / 1000 - 20, "r-late": end_ms / 1000 + 0.2, "r-failed": 0.0}
    deferred, late, failed = _split_by_deferral(ids, tis, job_ends, deferred_at)
    assert deferred == [pytest.approx(1.5)] and late == [pytest.approx(1.5)] * 2
    assert sorted(failed) == ["r-failed", "r-no-job", "r-unfinished"]


def test_a_run_is_created_once_through_a_stalled_api_server() -> None:
    import requests

    from bench.pipeline import _create_run

    class Stalling:
        def __init__(self, answers: list) -> None:
            self.answers, self.posts = answers, 0

        def post(self, path: str, json: dict, timeout: float) -> _Answer:
            self.posts += 1
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    body = {"dag_run_id": "b-1", "conf": {}}
    made_by_the_timed_out_try = Stalling([requests.ReadTimeout("stalled"), _Answer({}, 409)])
    assert _create_run(made_by_the_timed_out_try, "d", body) == "b-1" and made_by_the_timed_out_try.posts == 2
    after_a_500 = Stalling([_Answer({}, 500), _Answer({"dag_run_id": "b-1"})])
    assert _create_run(after_a_500, "d", body) == "b-1" and after_a_500.posts == 2
    with pytest.raises(RuntimeError, match="409"):  # a clash on the first try is somebody else's run
        _create_run(Stalling([_Answer({}, 409)]), "d", body)
    with pytest.raises(requests.ReadTimeout):
        _create_run(Stalling([requests.ReadTimeout("stalled")] * 3), "d", body)


def test_a_sigtermed_bench_still_stops_what_it_started(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    ready, stopped = tmp_path / "ready", tmp_path / "stopped"
    script = (
        "import pathlib, sys, time\n"
        "from bench.core import exit_on_sigterm\n"
        "exit_on_sigterm()\n"
        "try:\n"
        f"    pathlib.Path({str(ready)!r}).touch()\n"
        "    time.sleep(120)\n"
        "finally:\n"
        f"    pathlib.Path({str(stopped)!r}).touch()  # where the bench stops its Airflow and clusters\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        while not ready.exists() and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        proc.kill()
    assert stopped.exists(), "SIGTERM ended the bench without running its finally blocks"
