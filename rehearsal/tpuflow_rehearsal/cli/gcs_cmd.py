"""`tpuflow local gcs up|down`: a GCS emulator on loopback (tpuflow_rehearsal.gcs_emulator) and its GCE
metadata stand-in, for gs:// output roots without a cloud."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tpuflow.validation import check_folder, check_port


def _gcs_up(args: argparse.Namespace) -> int:
    from tpuflow.storage import split_gs_uri
    from tpuflow_rehearsal.gcs_emulator import GcsEmulator, GcsEmulatorError

    if args.port is not None:
        check_port("--port", args.port)
    check_folder("--state-dir", args.state_dir)
    for bucket in args.bucket or ():
        split_gs_uri(f"gs://{bucket}", "--bucket")

    try:
        emulator = GcsEmulator.start(
            port=args.port, buckets=args.bucket or (), state_dir=Path(args.state_dir) if args.state_dir else None
        )
    except GcsEmulatorError as err:
        print(f"tpuflow: error: {err}", file=sys.stderr)
        return 1
    buckets = f"; buckets {', '.join(args.bucket)}" if args.bucket else ""
    print(
        f"GCS emulator (fake-gcs-server) at {emulator.url}, pid {emulator.pid}{buckets}; GCE metadata stand-in "
        f"at {emulator.metadata_address}, pid {emulator.metadata_pid}; stop both: tpuflow local gcs down",
        file=sys.stderr,
    )
    for key, value in emulator.env().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def _gcs_down(args: argparse.Namespace) -> int:
    from tpuflow_rehearsal.gcs_emulator import GcsEmulator

    check_folder("--state-dir", args.state_dir)
    emulator = GcsEmulator.load(Path(args.state_dir) if args.state_dir else None)
    if emulator is None:
        print("no GCS emulator recorded; nothing to stop")
        return 0
    metadata_ran = emulator.metadata_is_alive()
    ran = emulator.stop()
    what = f"the GCS emulator at {emulator.url} (pid {emulator.pid})"
    also = f"; stopped its GCE metadata stand-in (pid {emulator.metadata_pid})" if metadata_ran else ""
    print(f"stopped {what}{also}" if ran else f"{what} was not running{also}; state removed")
    return 0


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gcs` to `tpuflow local`'s verbs (the entry point `local.gcs` of the group tpuflow.commands)."""
    gcs = verbs.add_parser("gcs", help="a GCS emulator on loopback for gs:// output roots (fake-gcs-server)")
    gcs_verbs = gcs.add_subparsers(dest="gcs_verb", required=True)
    state_help = "where its state and data live (default $TPUFLOW_HOME/gcs-emulator)"
    up = gcs_verbs.add_parser(
        "up", help="start it (and its GCE metadata stand-in) and print the export lines that point clients at it"
    )
    up.add_argument("--port", type=int, default=None, help="loopback port (default: a free one)")
    up.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    up.add_argument("--state-dir", default=None, help=state_help)
    up.set_defaults(func=_gcs_up)
    down = gcs_verbs.add_parser("down", help="stop it, by the pid it recorded")
    down.add_argument("--state-dir", default=None, help=state_help)
    down.set_defaults(func=_gcs_down)
