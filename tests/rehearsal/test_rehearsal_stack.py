"""A RehearsalStack claims its pod network (a Linux bridge) when it starts, not when it is built: building one to
read its settings, or one whose start is never reached, leaves nothing on the machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tpuflow_rehearsal.rehearsal import RehearsalStack


def bridges() -> set[str]:
    shown = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in shown.splitlines() if line.startswith("tpfbr")}


def test_building_a_stack_claims_no_pod_network(tmp_path: Path) -> None:
    before = bridges()
    stack = RehearsalStack(tmp_path / "rehearsal")
    assert stack.index is None and bridges() == before
    stack.stop()  # a stack never started stops nothing of anyone else's
    assert bridges() == before
