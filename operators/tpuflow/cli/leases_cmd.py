"""`tpuflow leases list|free`: see and free slice leases (operators/slices) from a shell."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from tpuflow.validation import check_count

if TYPE_CHECKING:
    from tpuflow.slices.leases import LeaseStore


def _store(args: argparse.Namespace) -> LeaseStore:
    from tpuflow.slices.leases import default_lease_root, lease_store

    return lease_store(args.lease_root or default_lease_root(), args.gcp_conn_id)


def _list(args: argparse.Namespace) -> int:
    from tpuflow.slices.leases import MAX_LEASE_SLOTS

    store = _store(args)
    if args.max_slices is None:
        held = store.all_holders()
    else:
        check_count("--max-slices", args.max_slices, minimum=1, maximum=MAX_LEASE_SLOTS)
        held = store.holders(args.max_slices)
    if not held:
        print(f"no slice leases held in {store.describe()}")
    for slot, lease in sorted(held.items()):
        age = (time.time() - lease.acquired_at) / 60 if lease.acquired_at else float("nan")
        dead = lease.dead_reason()
        state = f"; free to take over: {dead}" if dead else ""
        print(f"slot {slot}: {lease.holder_line()} (for {age:.0f} min{state})")
    return 0


def _free(args: argparse.Namespace) -> int:
    store = _store(args)
    freed = store.release(args.holder)
    print(f"freed slot(s) {freed} of {args.holder}" if freed else f"{args.holder} holds no lease in {store.describe()}")
    return 0 if freed else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("leases", help="slice leases that keep runs (and backfills) to N slices at once")
    verbs = parser.add_subparsers(dest="verb", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--lease-root",
            default=None,
            help="folder or gs://bucket/prefix (default $TPUFLOW_SLICE_LEASES, else $TPUFLOW_HOME/slice-leases)",
        )
        p.add_argument("--gcp-conn-id", default="google_cloud_default", help="Airflow connection for a gs:// root")

    listing = verbs.add_parser("list", help="who holds which lease")
    common(listing)
    listing.add_argument(
        "--max-slices", type=int, default=None, help="only the first N slots (default: every lease in the folder)"
    )
    listing.set_defaults(func=_list)
    free = verbs.add_parser("free", help="give back the lease of a run that will not (a deleted or killed run)")
    common(free)
    free.add_argument("holder", help="DAG_ID/RUN_ID, as `tpuflow leases list` shows it")
    free.set_defaults(func=_free)
