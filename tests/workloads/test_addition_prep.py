"""The prep entrypoint through Ray Data on the session's local Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from addition import data, prep
from tpuflow_driver.result import parse_result


def _read(path: str) -> dict[str, list]:
    """What prep wrote, read with plain pyarrow (checking Ray Data's output, not using it)."""
    table = pq.read_table(path, columns=["problem_id", "prompt", "answer", "split"]).sort_by("problem_id")
    return table.to_pydict()


def test_prep_writes_disjoint_deterministic_splits(prepared: dict[str, Any]) -> None:
    assert prepared["skipped"] is False
    assert (prepared["train_rows"], prepared["heldout_rows"]) == (9800, 200)
    train, held = _read(prepared["train_path"]), _read(prepared["heldout_path"])
    assert set(train["split"]) == {"train"} and set(held["split"]) == {"heldout"}
    assert len(held["problem_id"]) == 200 and len(train["problem_id"]) == 9800
    assert not set(train["problem_id"]) & set(held["problem_id"])
    # the Ray pipeline writes exactly what in-process generation gives for the date
    expected = data.generate(prepared["date"], "heldout", 200, num_heldout=200)
    assert sorted(held["prompt"]) == sorted(expected["prompt"].tolist())
    assert all(p == f"{int(p[:-1].split('+')[0])}+{int(p[:-1].split('+')[1])}=" for p in held["prompt"])
    assert pq.read_schema(next(Path(prepared["train_path"]).glob("*.parquet"))).names[-1] == "tokens"


def test_prep_is_idempotent_and_regenerates_on_new_parameters(
    ray_local: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = tmp_path / "ds"
    out = f"file://{local}"  # a URI, as gs:// would be, through the same pyarrow filesystem code
    args = ["--output-dir", out, "--date", "2026-06-01", "--num-train", "300", "--num-heldout", "50", "--seed", "3"]
    prep.main(args)
    first = parse_result(capsys.readouterr().out)
    assert first is not None and first["skipped"] is False and first["train_rows"] == 300
    assert first["train_path"] == f"{out}/train"
    files = sorted(p.name for p in (local / "train").iterdir())
    first_heldout = _read(first["heldout_path"])["problem_id"]

    prep.main(args)
    second = parse_result(capsys.readouterr().out)
    assert second is not None and second["skipped"] is True
    assert {k: v for k, v in second.items() if k != "skipped"} == {k: v for k, v in first.items() if k != "skipped"}
    assert sorted(p.name for p in (local / "train").iterdir()) == files  # untouched

    prep.main([*args[:-2], "--seed", "4"])
    third = parse_result(capsys.readouterr().out)
    assert third is not None and third["skipped"] is False and third["seed"] == 4
    assert len(_read(third["train_path"])["problem_id"]) == 300  # overwritten, not appended
    assert _read(third["heldout_path"])["problem_id"] != first_heldout  # another seed, other problems


def test_prep_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        prep.parse_args(["--output-dir", "x", "--date", "2026-13-01"])
    with pytest.raises(SystemExit):
        prep.parse_args(["--output-dir", "x", "--date", "2026-01-01", "--num-heldout", "10000"])
    args = prep.parse_args(["--output-dir", "x", "--date", "2026-01-01", "--digits", "1", "--num-heldout", "20"])
    assert args.num_train == 80
