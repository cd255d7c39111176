"""The `tpuflow` command finds the rehearsal's commands (demo, run, airflow, standins, local gcs) through the
entry-point group tpuflow.commands, never by importing tpuflow_rehearsal; without the rehearsal installed each
of them says, in one line, what to install (tests/packaging/test_packaging.py runs the same from the bare wheel).
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

import tpuflow.cli as cli

REHEARSAL_COMMANDS = [["demo"], ["run"], ["airflow"], ["standins"], ["local", "gcs"]]


def test_importing_the_command_line_loads_no_rehearsal_module() -> None:
    code = "import json, sys, tpuflow.cli; print(json.dumps(sorted(m for m in sys.modules if 'rehearsal' in m)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == []


def test_the_rehearsal_declares_every_command_the_provider_names() -> None:
    found = {entry.name for entry in cli.command_entry_points()}
    assert found == set(cli.REHEARSAL_COMMANDS), 'rehearsal/pyproject.toml [project.entry-points."tpuflow.commands"]'
    assert all(entry.value.startswith("tpuflow_rehearsal.") for entry in cli.command_entry_points())


@pytest.mark.parametrize("argv", REHEARSAL_COMMANDS, ids=" ".join)
def test_with_the_rehearsal_its_commands_are_its_own(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tpuflow {' '.join(argv)}") and "not installed" not in out


@pytest.fixture
def no_rehearsal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [])


@pytest.mark.parametrize("argv", [*REHEARSAL_COMMANDS, ["demo", "--help"], ["demo", "--framework", "torch", "-h"]])
def test_without_the_rehearsal_a_command_says_what_to_install(
    no_rehearsal: None, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    command = " ".join(a for a in argv if not a.startswith("-") and a != "torch")
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"tpuflow {command}: the rehearsal distribution (tpuflow-rehearsal) is not installed"), err
    assert "pip install tpuflow-rehearsal" in err and "make install" in err


def test_without_the_rehearsal_the_help_and_the_provider_commands_still_work(
    no_rehearsal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    for command in ("slice", "local", "render", "leases", "reap", "demo", "run", "airflow", "standins"):
        assert command in listed
    assert cli.main(["slice", "--accelerator", "tpu-v6e-slice", "--topology", "2x4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["topology"] == "2x4"
    with pytest.raises(SystemExit) as bad:
        cli.main(["slice", "--accelerator", "tpu-v6e-slice", "--topology", "2x4", "--no-such-flag"])
    assert bad.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_a_verb_of_a_command_this_version_lacks_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    stray = EntryPoint(name="nosuch.verb", value="tpuflow_rehearsal.no_such_module:register", group=cli.COMMANDS_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [stray])
    parser = cli.build_parser()  # the stray entry point is never loaded
    assert parser.parse_known_args(["demo"])[0].any_arguments
