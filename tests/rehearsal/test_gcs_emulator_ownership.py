"""`tpuflow local gcs down` signals the recorded pid only while it is the fake-gcs-server that start() ran
(``-filesystem-root <its data folder>``): after a reboot or pid wrap that pid is someone else's."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
from support.processes import sleeper, survives

from tpuflow_rehearsal.gcs_emulator import STATE_FILE, GcsEmulator


def _emulator(state: Path, pid: int, data_dir: str) -> GcsEmulator:
    state.mkdir(parents=True, exist_ok=True)
    emulator = GcsEmulator(pid, "127.0.0.1", 1, data_dir, str(state / "emulator.log"), str(state))
    (state / STATE_FILE).write_text(json.dumps(asdict(emulator)))  # as start() records it
    loaded = GcsEmulator.load(state)
    assert loaded == emulator
    return loaded


@pytest.mark.parametrize("data_dir", ["", "DATA"], ids=["no data folder recorded", "names the data folder"])
def test_down_leaves_a_process_that_is_not_the_emulator(
    tmp_path: Path, procs: list[subprocess.Popen], data_dir: str
) -> None:
    data = str(tmp_path / "data") if data_dir else ""
    other = sleeper(procs, f"{tmp_path / 'data'}")  # e.g. `du` on the data folder: not the server
    emulator = _emulator(tmp_path / "state", other.pid, data)

    assert not emulator.is_alive()
    assert emulator.stop(timeout=1) is False
    assert survives(other)
    assert not (tmp_path / "state" / STATE_FILE).exists()


def test_down_stops_the_server_serving_its_data_folder(tmp_path: Path, procs: list[subprocess.Popen]) -> None:
    data = str(tmp_path / "data")
    server = sleeper(procs, "-filesystem-root", data, "-port", "1")  # the arguments start() gives fake-gcs-server
    emulator = _emulator(tmp_path / "state", server.pid, data)

    assert emulator.is_alive()
    assert emulator.stop(timeout=5) is True
    assert server.wait(timeout=10) is not None
