"""`tpuflow reap [--dry-run] [--older-than 2h]`: delete what finished, killed or expired runs left behind.

What a keep_endpoint run kept (labelled tpuflow-kept=true; a local cluster's state "kept") is never deleted:
each run says how many it skipped. Delete a kept endpoint with kubectl / gcloud / `tpuflow local down` (the
commands: the tpuflow.cost.reaper docstring, or the README's orphan reaper section).

Without an Airflow metadata DB (a plain shell after `tpuflow demo`; or --without-db) no run state can be read:
local clusters and slice leases are then judged by the process that supervised their run (a `tpuflow demo`,
an `airflow dags test`): one provably dead (exited, its pid reused, its host rebooted) is reaped at once, whatever
its age. With a DB, such a resource is reaped too even while the DB still lists its run as running.
"""

from __future__ import annotations

import argparse
import sys


def _run_states(without_db: bool):  # -> RunStates
    """The metadata DB's running runs; without one, run states that cover no DAG (only what is provably
    over is reaped: a dead supervisor, an expiry, processes gone)."""
    from tpuflow.cost.reaper import FixedRunStates, MetadataDbRunStates

    if not without_db:
        try:
            return FixedRunStates(MetadataDbRunStates().running())
        except Exception as err:  # no DB configured, not migrated, unreachable
            text = (str(err).strip().splitlines() or [type(err).__name__])[0]
            print(
                f"tpuflow reap: no Airflow metadata DB to read ({text}); judging local clusters and slice leases "
                "by the process that supervised their run",
                file=sys.stderr,
            )
    return FixedRunStates({}, dag_ids=[])


def _reap(args: argparse.Namespace) -> int:
    from tpuflow.cost.reaper import ReaperListError, ReaperScope, collect_orphans, parse_duration, reap

    older_than = parse_duration(args.older_than)
    scope = ReaperScope(
        gcp_conn_id=args.gcp_conn_id,
        project_id=args.project,
        location=args.location,
        cluster_name=args.cluster,
        kubernetes_conn_id=args.kubernetes_conn_id,
        namespace=args.namespace,
        local_base_dir=args.base_dir,
        lease_root=args.lease_root,
    )
    try:
        orphans = collect_orphans(scope, _run_states(args.without_db), older_than=older_than)
    except ReaperListError as err:
        print(f"tpuflow reap: nothing deleted: {err}", file=sys.stderr)
        return 1
    outcome = reap(orphans, dry_run=args.dry_run)
    return 1 if outcome["failed"] else 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "reap",
        help="delete node pools, RayClusters, RayServices, local clusters and leases of runs that no longer run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be deleted, and why; delete nothing")
    parser.add_argument("--older-than", default="2h", help="only resources at least this old (default 2h; 30m, 1d, 0s)")
    parser.add_argument("--project", default=None, help="GKE: the cluster's project (with --location and --cluster)")
    parser.add_argument("--location", default=None, help="GKE: the cluster's zone or region")
    parser.add_argument("--cluster", default=None, help="GKE: the cluster")
    parser.add_argument("--gcp-conn-id", default="google_cloud_default", help="Airflow connection for the GKE API")
    parser.add_argument("--kubernetes-conn-id", default=None, help="a kubernetes connection (default: via GKE)")
    parser.add_argument("--namespace", default=None, help="namespace of the RayClusters (default: the connection's)")
    parser.add_argument("--base-dir", default=None, help="local cluster state (default $TPUFLOW_HOME/clusters)")
    parser.add_argument(
        "--without-db",
        action="store_true",
        help="do not read the Airflow metadata DB: reap only what is provably over (a dead supervising process)",
    )
    parser.add_argument("--lease-root", default=None, help="slice leases (default $TPUFLOW_SLICE_LEASES)")
    parser.set_defaults(func=_reap)
