"""A node whose raylet aborted while `ray start` lingers is a failed start (retried at once), not a slow one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tpuflow.local import cluster as cluster_mod

# A "ray start" stand-in: starts a child named raylet that exits at once and is never reaped. The Popen is kept
# referenced: a dropped one polls its child as it is collected, reaping a child that already exited.
NODE = """
import subprocess, sys, time
raylet = subprocess.Popen([sys.argv[1]])
time.sleep(300)
"""


def test_an_exited_raylet_marks_its_node_failed(tmp_path: Path) -> None:
    raylet = tmp_path / "raylet"
    shutil.copy(shutil.which("true") or "/bin/true", raylet)
    node = subprocess.Popen([sys.executable, "-c", NODE, str(raylet)], start_new_session=True)
    healthy = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while node.pid not in cluster_mod._exited_raylets([node.pid, healthy.pid]):
            assert time.monotonic() < deadline, "the exited raylet was never seen"
            time.sleep(0.05)
        assert cluster_mod._exited_raylets([healthy.pid]) == set()
    finally:
        for proc in (node, healthy):
            proc.kill()
            proc.wait()
