"""The `tpuflow` command line: slice catalog, local cluster, manifest rendering."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, TypeAlias

from tpuflow.cli import leases_cmd, local_cmd, reap_cmd, render_cmd, slice_cmd
from tpuflow.errors import UserInputError

# Commands other distributions add: each entry point's name is a command (a dotted name is a verb of one of
# the commands here: local.gcs is `tpuflow local gcs`), its value a register(subparsers) function. The provider
# never imports them; the rehearsal distribution (tpuflow-rehearsal, rehearsal/ in the repository) declares these.
COMMANDS_GROUP = "tpuflow.commands"
REHEARSAL = "tpuflow-rehearsal"
REHEARSAL_COMMANDS = {
    "demo": "run the local pipeline end to end (needs the rehearsal distribution)",
    "run": "run your own DAG file on the embedded cluster or the rehearsal (needs the rehearsal distribution)",
    "airflow": "a real local Airflow on loopback (needs the rehearsal distribution)",
    "standins": "the GKE, Kubernetes and KubeRay stand-ins on loopback (needs the rehearsal distribution)",
    "local.gcs": "a GCS emulator on loopback (needs the rehearsal distribution)",
}
INSTALL_HINT = (
    f"the rehearsal distribution ({REHEARSAL}) is not installed: `pip install {REHEARSAL}` beside tpuflow "
    f"(in a checkout: `make install`, or `uv pip install -e rehearsal`)"
)

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def command_entry_points() -> list[EntryPoint]:
    return sorted(entry_points(group=COMMANDS_GROUP), key=lambda ep: ep.name)


def _not_installed(command: str) -> Callable[[argparse.Namespace], int]:
    def say(args: argparse.Namespace) -> int:
        print(f"tpuflow {command}: {INSTALL_HINT}", file=sys.stderr)
        return 2

    return say


def _placeholder(where: Subparsers, verb: str, command: str, help_text: str) -> None:
    """A command whose distribution is missing: any arguments, one line saying what to install."""
    parser = where.add_parser(verb, help=help_text, add_help=False)
    parser.set_defaults(func=_not_installed(command), any_arguments=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpuflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    verbs: dict[str, Subparsers] = {}
    slice_cmd.register(sub)
    verbs["local"] = local_cmd.register(sub)
    render_cmd.register(sub)
    leases_cmd.register(sub)
    reap_cmd.register(sub)
    found = set()
    for entry in command_entry_points():
        parent, _, verb = entry.name.rpartition(".")
        if parent and parent not in verbs:
            continue  # a verb of a command this version does not have
        register: Callable[[Subparsers], Any] = entry.load()
        register(verbs[parent] if parent else sub)
        found.add(entry.name)
    for name, help_text in REHEARSAL_COMMANDS.items():
        if name not in found:
            parent, _, verb = name.rpartition(".")
            _placeholder(verbs[parent] if parent else sub, verb, name.replace(".", " "), help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")  # what parse_args says
    try:
        return int(args.func(args) or 0)
    except UserInputError as err:
        print(f"tpuflow: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.filename is None:
            raise
        # A path the user named that cannot be read or written (a file for a folder, no permission).
        print(f"tpuflow: error: {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
