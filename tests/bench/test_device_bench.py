"""python -m bench --device: skipped without a TPU; with TPUFLOW_BENCH_DEVICE_ALLOW_CPU=1 and the tiny size,
every row runs on the CPU and device.json has its fields (no timing asserts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROWS = {"device_train_step_ratio", "device_model_step", "device_model_mfu", "time_to_first_step_s",
        "checkpoint_on_notice_s", "serve_forward_ms"}  # fmt: skip


def bench(tmp_path: Path, **env: str) -> dict:
    full = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    done = subprocess.run([sys.executable, "-m", "bench", "--device", "--results", str(tmp_path)], cwd=REPO,
                          env=full, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((tmp_path / "device.json").read_text())


def test_without_a_tpu_every_row_is_skipped_with_its_reason(tmp_path: Path) -> None:
    data = bench(tmp_path)
    assert {m["name"] for m in data["measures"]} == ROWS
    assert all(m["value"] is None and m["notes"].startswith("skipped: no TPU") for m in data["measures"])
    assert data["machine"]["chip"]["platform"] == "cpu" and "commit" in data["machine"]


@pytest.mark.long  # every row on the CPU, ~130 s on 2 cores (CI time); make test keeps the case above
def test_tiny_rows_run_on_the_cpu_when_allowed(tmp_path: Path) -> None:
    data = bench(tmp_path, TPUFLOW_BENCH_DEVICE_ALLOW_CPU="1", TPUFLOW_BENCH_DEVICE_SIZE="tiny")
    rows = {(m["name"], m["variant"]): m for m in data["measures"]}
    assert {n for n, _ in rows} == ROWS and not data["errors"]
    ratio = rows[("device_train_step_ratio", "")]
    assert ratio["ratio"] > 0 and len(ratio["details"]["ratios"]) == 2
    assert rows[("device_model_step", "")]["details"]["flops_shape"] > 0
    first = rows[("time_to_first_step_s", "demo")]
    assert len(first["details"]["cold_s"]) == 2 and all(r["cache_files"] > 0 for r in first["details"]["runs"])
    ckpt = rows[("checkpoint_on_notice_s", "")]["details"]
    assert ckpt["restore_bit_exact"] is True and ckpt["n"] == 3 and ckpt["state_bytes"] > 0
    assert {v for _, v in rows if _ == "serve_forward_ms"} == {"batch 1", "batch 32"}
    assert all(rows[("serve_forward_ms", v)]["details"]["p99"] > 0 for v in ("batch 1", "batch 32"))
