"""The acceptance run: `tpuflow demo --num-slices 2 --topology 2x4 --machine-type ct6e-standard-4t` trains across
two simulated slices (4 workers, 2 per slice, never mixed), after its preflight, and passes the accuracy gate.
A whole pipeline run: make test-long (make test keeps tests/workloads/test_multislice.py's short run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_local_pipeline import DATE, cluster_states, run_demo

pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.mark.timeout(2400)
def test_demo_trains_across_two_slices(tmp_path: Path) -> None:
    proc = run_demo(tmp_path, "--num-slices", "2", "--topology", "2x4", "--machine-type", "ct6e-standard-4t",
                    timeout=2300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    run_dir = tmp_path / "outputs" / "tpu_llm_pipeline_local" / DATE
    report = json.loads((run_dir / "report.json").read_text())
    assert report["accuracy"] >= 0.9
    assert "[preflight] all 4 rank(s) saw the sum 10.0 (jax)" in (run_dir / "logs" / "preflight.log").read_text()
    train_log = (run_dir / "logs" / "train-jax.log").read_text()
    assert "data parallel across 2 slices, one mesh over all 4 devices" in train_log
    ranks = re.findall(r"rank \d: slice (\S+) worker (\d), MEGASCALE_SLICE_ID=(\d) of 2", train_log)
    assert len(ranks) == 4 and len({(name, sid) for name, _, sid in ranks}) == 2, ranks  # 2 per slice, never mixed
    assert cluster_states(tmp_path) == []  # the cluster of both slices is gone
