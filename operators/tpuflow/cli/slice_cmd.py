"""`tpuflow slice`: describe a TPU slice from the catalog."""

from __future__ import annotations

import argparse
import json

from tpuflow.errors import UserInputError
from tpuflow.naming import TaskIdentity
from tpuflow.tpu import TpuSlice


def add_slice_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument("--accelerator", required=required, help="TPU-V6E, tpu-v6e-slice or v6e")
    parser.add_argument("--topology", required=required, help="slice shape, e.g. 4x4 or 2x2x2 (not a chip count)")
    parser.add_argument("--machine-type", default=None, help="e.g. ct6e-standard-4t (default: derived)")
    parser.add_argument(
        "--num-slices",
        default="1",
        help="number of identical slices (default 1); at most 15,000 hosts in all (GKE's nodes per cluster), "
        "1,000 single-host slices on GKE (nodes per node pool)",
    )


def slice_from_args(args: argparse.Namespace) -> TpuSlice:
    return TpuSlice.from_spec(args.accelerator, args.topology, args.machine_type, args.num_slices)


def add_identity_arguments(parser: argparse.ArgumentParser) -> None:
    """--dag-id/--run-id/--task-id/--map-index: render what that task instance would create."""
    parser.add_argument("--dag-id", default=None)
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--task-id", default=None)
    parser.add_argument("--map-index", type=int, default=-1)


def identity_from_args(args: argparse.Namespace) -> TaskIdentity | None:
    """The task instance named on the command line, or None when none is."""
    if not (args.dag_id or args.run_id or args.task_id):
        return None
    if not (args.dag_id and args.run_id and args.task_id):
        raise UserInputError("--task-id", args.task_id, "give --dag-id, --run-id and --task-id together")
    return TaskIdentity(args.dag_id, args.run_id, args.task_id, args.map_index)


def _run(args: argparse.Namespace) -> int:
    tpu = slice_from_args(args)
    print(json.dumps(tpu.to_dict(), indent=2) if args.json else tpu.summary())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("slice", help="describe a TPU slice (chips, hosts, machine type, ScalingConfig)")
    add_slice_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_run)
