"""The bench code cannot rot: `python -m bench --quick --only dag_parse_ratio` runs and writes its files.

No timing assertions: the figures depend on the machine; only the shape of the results is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KEYS = {"name", "value", "unit", "baseline", "ratio", "goal", "met"}


def test_quick_dag_parse_run_writes_json_markdown_and_charts(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "dag_parse_ratio", "--results", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {"cpu_count", "cpu_model", "python", "ray", "jax", "airflow", "date"} <= set(data["machine"])
    assert data["machine"]["cpu_count"] >= 1 and data["errors"] == []
    rows = data["measures"]
    dag_files = sorted(p.name for p in (REPO / "dags").glob("*.py"))
    assert sorted(r["variant"] for r in rows) == dag_files
    for r in rows:
        assert KEYS <= set(r) and r["name"] == "dag_parse_ratio" and r["unit"] == "ms"
        assert r["value"] > 0 and r["baseline"] > 0
        assert abs(r["ratio"] - r["value"] / r["baseline"]) < 0.01 * r["ratio"] + 1e-3
        assert r["goal"] == "ratio <= 1.3" and r["met"] == (r["ratio"] <= 1.3)
        assert r["details"]["one_task_dag_ms"] > 0
    md = (tmp_path / "latest.md").read_text()
    assert "| measure | value | unit | baseline | ratio | goal | met |" in md
    assert all(f"dag_parse_ratio ({name})" in md for name in dag_files)
    assert data["charts"] == ["summary.png"]
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_measure_is_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "bench", "--only", "no_such_measure", "--results", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "unknown measure" in out.stderr
    assert not (tmp_path / "latest.json").exists()
