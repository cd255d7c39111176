"""The `tpuflow` command line: slice catalog, local cluster, manifest rendering."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tpuflow.cli import airflow_cmd, leases_cmd, local_cmd, reap_cmd, render_cmd, run_cmd, slice_cmd, standins_cmd
from tpuflow.dev import demo as demo_cmd
from tpuflow.errors import UserInputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpuflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = (slice_cmd, local_cmd, render_cmd, demo_cmd, run_cmd, airflow_cmd, leases_cmd, reap_cmd, standins_cmd)
    for module in commands:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
