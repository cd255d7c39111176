"""The wait follows a driver log through Ray's log tail: each part of the log is fetched once, every line
is logged once (across dropped connections and resumed cursors), and the event still carries the
log's last lines and its TPUFLOW_RESULT, without the wait holding the whole log."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tpuflow.rayjob.waits import TAIL_LINES, LogFollower, wait_for_job

LOG = logging.getLogger("test.log_follow")


def test_only_whole_lines_are_logged_and_a_repeat_of_seen_text_is_skipped() -> None:
    f = LogFollower(offset=0)
    assert f.feed("a\nb", 0) == ["a"]
    assert f.feed("c\nd\n", 3) == ["bc", "d"]
    assert f.offset == f.seen == 7
    assert f.feed("a\nbc\nd\ne\n", 0) == ["e"], "a reconnected tail starts again at 0"
    assert f.feed("tail without newline", 9) == []
    assert f.finish() == ["tail without newline"]
    assert f.tail.splitlines() == ["a", "bc", "d", "e", "tail without newline"]


def test_text_before_the_cursor_is_read_for_the_event_but_not_logged_again() -> None:
    log = 'TPUFLOW_RESULT {"accuracy": 0.5}\nstep 1\nstep 2\n'
    f = LogFollower(offset=log.index("step 2"))
    assert f.feed(log[:20], 0) == []
    assert f.feed(log[20:], 20) == ["step 2"]
    assert f.result == {"accuracy": 0.5} and f.tail.splitlines()[-1] == "step 2"
    assert f.offset == len(log)


def test_the_kept_tail_is_bounded_and_the_last_parseable_result_wins() -> None:
    f = LogFollower(offset=0)
    f.feed("".join(f"line {i}\n" for i in range(1000)), 0)
    f.feed('TPUFLOW_RESULT {"v": 1}\nTPUFLOW_RESULT not json\n', f.seen)
    assert len(f.tail.splitlines()) == TAIL_LINES and f.result == {"v": 1}


class TailedJob:
    """A job that prints `lines` lines, one per tail read, then SUCCEEDED; its tail can break."""

    def __init__(self, lines: int, *, break_after: int | None = None, tail_works: bool = True) -> None:
        self.text = "".join(f"step {i}\n" for i in range(lines)) + f'TPUFLOW_RESULT {{"steps": {lines}}}\n'
        self.written = 0
        self.break_after, self.tail_works = break_after, tail_works
        self.full_fetches = self.tails = 0

    def _grow(self) -> None:
        if self.written < len(self.text):
            self.written = self.text.index("\n", self.written) + 1

    async def aget_job_info(self, sid: str) -> dict[str, Any]:
        if not self.tail_works:
            self._grow()
        return {"status": "SUCCEEDED" if self.written == len(self.text) else "RUNNING"}

    async def aget_job_logs(self, sid: str) -> str:
        self.full_fetches += 1
        return self.text[: self.written]

    async def atail_job_logs(self, sid: str) -> AsyncIterator[str]:
        self.tails += 1
        if not self.tail_works:
            raise ConnectionError("websocket upgrade refused")
        sent = 0
        while sent < len(self.text):
            self._grow()
            yield self.text[sent : self.written]
            sent = self.written
            if self.break_after is not None and self.tails == 1 and sent >= self.break_after:
                raise ConnectionError("connection reset")
            await asyncio.sleep(0.001)

    async def astop_job(self, sid: str) -> None:
        raise AssertionError("not stopped")


def _logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().split("[ray job] ", 1)[1] for r in caplog.records if "[ray job] " in r.getMessage()]


def _wait(job: TailedJob, **kwargs: Any) -> Any:
    kwargs = {"poll_interval": 0.01, "timeout": 60, "started_at": time.time(), **kwargs}
    return asyncio.run(wait_for_job(job, "s", log=LOG, **kwargs))


def test_a_tailed_log_streams_from_one_tail_and_a_short_one_is_downloaded_at_most_once(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    job = TailedJob(30)
    event = _wait(job)
    assert event["status"] == "success" and event["result"] == {"steps": 30}
    assert _logged(caplog) == job.text.splitlines()
    assert job.full_fetches <= 1 and job.tails == 1


def test_a_dropped_tail_reconnects_and_no_line_is_logged_twice(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    job = TailedJob(20, break_after=60)
    event = _wait(job)
    assert event["result"] == {"steps": 20} and job.tails == 2
    assert _logged(caplog) == job.text.splitlines()


def test_without_a_tail_the_wait_falls_back_to_polling_the_whole_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    job = TailedJob(10, tail_works=False)
    event = _wait(job)
    assert event["status"] == "success" and event["result"] == {"steps": 10}
    assert _logged(caplog) == job.text.splitlines() and job.full_fetches > 0


def test_a_resumed_wait_logs_only_past_its_offset_and_saves_the_cursor(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    job = TailedJob(10)
    offset = job.text.index("step 6")
    saved: list[int] = []

    async def save(value: int) -> None:
        saved.append(value)

    event = _wait(job, offset=offset, save_offset=save)
    assert _logged(caplog) == job.text[offset:].splitlines()
    assert event["result"] == {"steps": 10} and "step 0" in event["log_tail"]
    assert saved and saved[-1] == len(job.text) and saved == sorted(saved)


class LingeringTail(TailedJob):
    """Ray's tail as it behaves under load: the job is SUCCEEDED and its file complete, but the tail sends
    the last lines and closes only `linger` seconds later."""

    def __init__(self, lines: int, linger: float, line_chars: int = 0) -> None:
        super().__init__(lines)
        if line_chars:
            self.text = "".join(f"{i:06d} {'x' * line_chars}\n" for i in range(lines)) + 'TPUFLOW_RESULT {"ok": 1}\n'
        self.written, self.linger, self.streamed = len(self.text), linger, False

    async def aget_job_info(self, sid: str) -> dict[str, Any]:
        # the job ends once the tail has sent its first half (what a tail following a running job has sent)
        return {"status": "SUCCEEDED" if self.streamed else "RUNNING"}

    async def atail_job_logs(self, sid: str) -> AsyncIterator[str]:
        self.tails += 1
        half = len(self.text) // 2
        yield self.text[:half]
        self.streamed = True
        await asyncio.sleep(self.linger)
        yield self.text[half:]


def test_a_short_log_is_fetched_whole_at_the_jobs_end_rather_than_waiting_for_the_tail_to_close(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    job = LingeringTail(30, linger=5.0)
    started = time.monotonic()
    event = _wait(job)
    assert event["result"] == {"steps": 30} and job.full_fetches == 1
    assert time.monotonic() - started < 4.0, "the wait waited for the tail to close"
    assert _logged(caplog) == job.text.splitlines(), "every line once, in order"


def test_a_long_log_is_drained_from_the_tail_not_downloaded_again(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    job = LingeringTail(2400, linger=0.3, line_chars=1000)  # 2.4 MB: its first half is past the threshold
    event = _wait(job)
    assert event["result"] == {"ok": 1} and job.full_fetches == 0
    assert _logged(caplog) == job.text.splitlines()


def test_a_short_log_whose_whole_fetch_fails_still_comes_whole_from_the_tail(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    job = LingeringTail(30, linger=0.2)

    async def refused(sid: str) -> str:
        job.full_fetches += 1
        raise ConnectionError("dashboard busy")

    job.aget_job_logs = refused  # type: ignore[method-assign]
    event = _wait(job)
    assert event["result"] == {"steps": 30} and job.full_fetches == 1
    assert _logged(caplog) == job.text.splitlines()


def test_a_short_log_whose_tail_closes_before_the_whole_fetch_answers_ends_with_the_tail(caplog) -> None:
    """Many jobs ending at once keep the dashboard busy: the tail's last chunk can come before the fetched log,
    and the wait then ends with the tail rather than waiting for the fetch (which it cancels)."""
    caplog.set_level(logging.INFO, logger=LOG.name)
    job = LingeringTail(30, linger=0.05)
    cancelled: list[bool] = []

    async def slow(sid: str) -> str:
        job.full_fetches += 1
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return job.text

    job.aget_job_logs = slow  # type: ignore[method-assign]
    event = _wait(job)
    assert job.full_fetches == 1 and cancelled == [True], "the fetch was started, then dropped for the tail"
    assert event["result"] == {"steps": 30} and _logged(caplog) == job.text.splitlines()


class ForgottenJob(TailedJob):
    """A job the Ray head forgets mid-run: its head restarted (KubeRay's pod started again on a rebooted node)."""

    def __init__(self) -> None:
        super().__init__(5)
        self.polls = 0

    async def aget_job_info(self, sid: str) -> dict[str, Any] | None:
        self.polls += 1
        return {"status": "RUNNING"} if self.polls < 3 else None


def test_a_job_its_ray_head_forgot_fails_retryable_saying_the_head_restarted() -> None:
    event = _wait(ForgottenJob())
    assert event["status"] == "failed" and event["retryable"] is True, event
    assert "its head restarted or was replaced" in event["message"], event
    assert "a retry of the task submits the job again" in event["message"], event


class GoneHead(TailedJob):
    """A job whose dashboard stops answering mid-run (the head's pod gone, or replaced at a new address)."""

    def __init__(self, answers: int) -> None:
        super().__init__(5)
        self.answers = answers

    async def aget_job_info(self, sid: str) -> dict[str, Any]:
        if self.answers <= 0:
            raise ConnectionRefusedError("Connect call failed ('10.200.0.8', 8265)")
        self.answers -= 1
        return {"status": "RUNNING"}

    async def atail_job_logs(self, sid: str) -> AsyncIterator[str]:
        raise ConnectionError("gone")
        yield ""


def test_a_dashboard_silent_past_the_unreachable_timeout_fails_retryable_naming_the_head() -> None:
    event = _wait(GoneHead(answers=2), unreachable_timeout=0.2)
    assert event["status"] == "failed" and event["retryable"] is True, event
    assert "has not answered for 0.2 s" in event["message"] and "re-attaches to the job" in event["message"], event


def test_an_answer_between_silences_starts_the_unreachable_count_again() -> None:
    class Flapping(GoneHead):
        polls = 0

        async def aget_job_info(self, sid: str) -> dict[str, Any]:
            self.polls += 1
            if self.polls > 40:
                return {"status": "SUCCEEDED"}
            if self.polls % 5:
                raise ConnectionRefusedError("restarting")
            return {"status": "RUNNING"}

        async def aget_job_logs(self, sid: str) -> str:
            return self.text

    # 4 silent polls of 0.01 s in a row at most: never 0.2 s of silence
    event = _wait(Flapping(answers=0), unreachable_timeout=0.2)
    assert event["status"] == "success", event
