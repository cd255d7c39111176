"""Every `tpuflow` subcommand given a bad value: exit 2, one line naming the flag, the value and the fix,
no traceback, and nothing started (no subprocess, no server, no work dir state).

The table must cover every leaf subcommand of the parser: a new command without a bad-input case fails
`test_table_covers_every_subcommand`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tpuflow.cli import build_parser, main

P = "{tmp}"  # replaced by the test's tmp_path
NODEPOOL = ["render", "nodepool", "--project", "my-proj", "--location", "us-east5-b", "--cluster", "c1"]
V6E = ["--accelerator", "v6e", "--topology", "4x4"]

# (argv, text the one error line must hold: the flag or field, then the bad value, then part of the fix)
CASES: list[tuple[list[str], tuple[str, ...]]] = [
    (["slice", "--accelerator", "v9z", "--topology", "4x4"], ("accelerator", "'v9z'", "TPU-V6E")),
    (["slice", "--accelerator", "v6e", "--topology", "16"], ("topology", "16", "not a chip count")),
    (["slice", *V6E, "--num-slices", "0"], ("num_slices", "'0'", "1 or more")),
    # counts have GKE's maxima, checked before any work (a 20-digit count once ran 10 min and took 10 GB)
    (["slice", *V6E, "--num-slices", "99999999999999999999"], ("num_slices", "99999999999999999999", "15,000")),
    ([*NODEPOOL, *V6E, "--num-slices", "99999999999999999999"], ("num_slices", "9999", "at most 15,000")),
    ([*NODEPOOL, *V6E, "--num-slices", "3751"], ("num_slices", "'3751'", "at most 3,750 slices of 4 host")),
    (
        [*NODEPOOL, "--accelerator", "v6e", "--topology", "1x1", "--num-slices", "1001"],
        ("num_slices", "1001", "1,000 nodes per node pool"),
    ),
    (["render", "raycluster", *V6E, "--num-slices", "1" * 5000], ("num_slices", "111", "at most 15,000")),
    (["local", "up", *V6E, "--num-slices", "99999999999999999999", "--base-dir", P], ("num_slices", "9999", "15,000")),
    ([*NODEPOOL, *V6E, "--expires-after-hours", "nan"], ("--expires-after-hours", "nan", "> 0")),
    ([*NODEPOOL, *V6E, "--expires-after-hours", "-3"], ("--expires-after-hours", "-3", "> 0")),
    ([*NODEPOOL, *V6E, "--node-pool-name", "Bad_Name"], ("node_pool_name", "'Bad_Name'", "")),
    ([*NODEPOOL, *V6E, "--max-run-duration", "1h"], ("--max-run-duration", "'1h'", "whole seconds")),
    (["render", "raycluster", "--accelerator", "v6e", "--topology", "3x3"], ("topology", "'3x3'", "valid shapes")),
    (["render", "raycluster", *V6E, "--namespace", "Not_A_NS"], ("namespace", "'Not_A_NS'", "RFC 1123")),
    (
        ["render", "rayservice", *V6E, "--import-path", "acme.chat:app", "--app-arg", "accelerator_type=TPU-V5E"],
        ("applications[default].args.accelerator_type", "'TPU-V5E'", "'TPU-V6E'"),
    ),
    (["render", "rayservice", *V6E, "--serve-config", f"{P}/bad.yaml"], ("--serve-config", "bad.yaml", "YAML")),
    (["render", "rayservice", *V6E, "--serve-config", f"{P}/missing.yaml"], ("--serve-config", "missing", "file")),
    (
        ["render", "rayservice", "--accelerator", "v6e", "--topology", "2x2", "--llm", "m/x", "--hf-secret", ":k"],
        ("hf_secret", "':k'", "NAME:KEY"),
    ),
    (["local", "up", "--accelerator", "v6e", "--topology", "16", "--base-dir", P], ("topology", "16", "shape")),
    (["local", "up", *V6E, "--host-cpus", "0", "--base-dir", P], ("--host-cpus", "0", ">= 1")),
    (["local", "up", *V6E, "--name", "../escape", "--base-dir", P], ("--name", "'../escape'", "lowercase letters")),
    (["local", "status", "--name", "nope", "--base-dir", P], ("name", "'nope'", "no local cluster")),
    (["local", "down", "--name", "nope", "--base-dir", P], ("name", "'nope'", "no local cluster")),
    (["local", "env", "--name", "nope", "--base-dir", P], ("name", "'nope'", "no local cluster")),
    (["local", "preempt", "--host", "-1", "--base-dir", P], ("--host", "-1", ">= 0")),
    (["local", "preempt", "--host", "0", "--restart-after", "inf", "--base-dir", P], ("--restart-after", "inf", "")),
    (["local", "preempt", "--host", "0", "--notice", "soon", "--base-dir", P], ("--notice", "soon", "unit s, m")),
    (["local", "preempt", "--host", "0", "--notice", "2h", "--base-dir", P], ("--notice", "7200", "<= 3600")),
    (["local", "gcs", "up", "--port", "70000", "--state-dir", P], ("--port", "70000", "<= 65535")),
    (["local", "gcs", "up", "--bucket", "No Such!", "--state-dir", P], ("--bucket", "No Such!", "bucket name")),
    (["local", "gcs", "down", "--state-dir", f"{P}/a-file"], ("--state-dir", "a-file", "not a file")),
    (["leases", "list", "--max-slices", "0", "--lease-root", P], ("--max-slices", "0", ">= 1")),
    (
        ["leases", "free", "dag/run", "--lease-root", "gs://Bad Bucket"],
        ("lease_root", "gs://Bad Bucket", "bucket name"),
    ),
    (["reap", "--older-than", "5x", "--base-dir", P], ("--older-than", "'5x'", "unit s, m, h or d")),
    (["standins", "up", "--workdir", P, "--operation-seconds", "nan"], ("--operation-seconds", "nan", ">= 0")),
    (["standins", "up", "--workdir", P, "--crds", f"{P}/nope"], ("--crds", "nope", "ray.io_rayclusters.yaml")),
    (["standins", "down", "--workdir", f"{P}/a-file"], ("--workdir", "a-file", "not a file")),
    (["standins", "env", "--workdir", P], ("--workdir", P, "tpuflow standins up --workdir")),
    (["airflow", "up", "--work-dir", P, "--port", "0"], ("--port", "0", ">= 1")),
    (["airflow", "up", "--work-dir", P, "--parallelism", "0"], ("--parallelism", "0", ">= 1")),
    (["airflow", "up", "--work-dir", f"{P}/a-file"], ("--work-dir", "a-file", "folder")),
    (["airflow", "status", "--work-dir", f"{P}/a-file"], ("--work-dir", "a-file", "not a file")),
    (["airflow", "down", "--work-dir", f"{P}/a-file"], ("--work-dir", "a-file", "not a file")),
    (["airflow", "env", "--work-dir", f"{P}/a-file"], ("--work-dir", "a-file", "not a file")),
    # the demo: its flags are the pipeline's Params, checked with the Params' own schema and checks
    (["demo", "--topology", "16"], ("--topology", "'16'", "not a chip count; give a shape, e.g. 2x8, 4x4")),
    (["demo", "--accelerator", "TPU-V9"], ("--accelerator", "'TPU-V9'", "TPU-V6E")),
    (["demo", "--train-steps", "0"], ("--train-steps", "0", ">= 1")),
    (["demo", "--checkpoint-every", "0"], ("--checkpoint-every", "0", ">= 1")),
    (["demo", "--num-train", "5"], ("--num-train", "5", ">= 100")),
    (["demo", "--accuracy-threshold", "1.5"], ("--accuracy-threshold", "1.5", "<= 1")),
    (["demo", "--accuracy-threshold", "nan"], ("--accuracy-threshold", "nan", "")),
    (["demo", "--topology", "2x2x2"], ("--topology", "'2x2x2'", "2D")),
    (["demo", "--machine-type", "ct5p-hightpu-4t"], ("--machine-type", "ct5p-hightpu-4t", "ct6e")),
    (["demo", "--serve-topology", "9x9"], ("--serve-topology", "'9x9'", "use one of")),
    (["demo", "--serve-topology", "2x4"], ("--serve-topology", "'2x4'", "simulates only the training slice")),
    (["demo", "--date", "2026-13-01"], ("--date", "2026-13-01", "YYYY-MM-DD")),
    # another spelling of a day: the run would look for its outputs under a folder no task wrote
    (["demo", "--date", "20261203"], ("--date", "20261203", "YYYY-MM-DD")),
    (["demo", "--date", "2026-W49-4"], ("--date", "2026-W49-4", "YYYY-MM-DD")),
    # before the DAG's start_date: Airflow would run none of its tasks and mark the run successful
    (["demo", "--date", "2026-01-01"], ("--date", "2026-01-01", "on or after the DAG's start_date, 2026-11-01")),
    (["demo", "--backend", "gke", "--date", "2025-12-31"], ("--date", "2025-12-31", "start_date, 2026-11-01")),
    (["demo", "--num-slices", "99999999999999999999"], ("--num-slices", "99999999999999999999", "<= 64")),
    (["demo", "--operation-seconds", "-1"], ("--operation-seconds", "-1", ">= 0")),
    (["demo", "--output-root", "gs://Bad_Bucket!/x"], ("--output-root", "gs://Bad_Bucket!/x", "bucket name")),
    (["demo", "--backend", "gke", "--serve-topology", "2x2x1"], ("--serve-topology", "2x2x1", "2D")),
    (["demo", "--backend", "gke", "--keep-endpoint"], ("--keep-endpoint", "True", "stand-ins stop")),
    (["demo", "--idle-timeout", "5"], ("--idle-timeout", "5.0", "add --keep-endpoint")),
    (["demo", "--keep-endpoint", "--idle-timeout", "-1"], ("--idle-timeout", "-1.0", ">= 0")),
    # your own DAG file: the rest of its bad inputs are in tests/cli/test_run_cmd.py
    (["run", f"{P}/missing_dag.py"], ("DAG_FILE", "missing_dag.py", "no such file")),
    (["run", f"{P}/bad.yaml"], ("DAG_FILE", "bad.yaml", "Python file (.py)")),
]

# argparse's own rejections (a type or a choice): exit 2 and one "error:" line naming the flag.
ARGPARSE_CASES: list[tuple[list[str], str]] = [
    (["demo", "--train-steps", "many"], "--train-steps"),
    (["demo", "--framework", "tensorflow"], "--framework"),
    (["demo", "--backend", "aws"], "--backend"),
    (["local", "preempt", "--host", "one"], "--host"),
    (["airflow", "up", "--port", "http"], "--port"),
    (["render", "rayservice", *V6E, "--upgrade-strategy", "Blue"], "--upgrade-strategy"),
]


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    return [leaf for name, p in subs[0].choices.items() for leaf in _leaves(p, (*prefix, name))]


def _command(argv: list[str]) -> tuple[str, ...]:
    leaves = set(_leaves(build_parser()))
    for n in range(len(argv), 0, -1):
        if tuple(argv[:n]) in leaves:
            return tuple(argv[:n])
    raise AssertionError(f"no subcommand in {argv}")


def test_table_covers_every_subcommand() -> None:
    covered = {_command(argv) for argv, _ in CASES}
    assert set(_leaves(build_parser())) - covered == set()


def _run(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    (tmp_path / "bad.yaml").write_text("applications: [name: x\n  - : :\n")
    (tmp_path / "a-file").write_text("not a folder")
    argv = [a.replace(P, str(tmp_path)) for a in argv]
    if argv[0] == "demo":
        argv = [*argv, "--work-dir", str(tmp_path / "work")]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(a)[:70] for a, _ in CASES])
def test_bad_value_is_one_line_and_starts_nothing(
    argv: list[str],
    expected: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    nothing_starts: list[Any],
) -> None:
    code, err = _run(argv, tmp_path, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("tpuflow: error: "), err
    assert "Traceback" not in err
    line = lines[0]
    positions = [line.find(text.replace(P, str(tmp_path))) for text in expected if text]
    assert all(p >= 0 for p in positions), (expected, line)
    assert nothing_starts == []
    assert not (tmp_path / "work").exists()  # the demo made no Airflow home
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(("argv", "flag"), ARGPARSE_CASES, ids=[" ".join(a)[:60] for a, _ in ARGPARSE_CASES])
def test_argparse_rejections_name_the_flag(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: list[Any]
) -> None:
    code, err = _run(argv, tmp_path, capsys)
    assert code == 2
    assert "Traceback" not in err
    assert flag in err.strip().splitlines()[-1]
    assert nothing_starts == []


def test_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    """The real entry point, in its own process: what a user sees (exit 2, one line on stderr)."""
    work = tmp_path / "work"
    for argv in (
        ["demo", "--topology", "16", "--work-dir", str(work)],
        ["render", "rayservice", *V6E, "--import-path", "acme.chat:app", "--app-arg", "chips_per_host=8"],
    ):
        proc = subprocess.run([sys.executable, "-m", "tpuflow.cli", *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not work.exists()
