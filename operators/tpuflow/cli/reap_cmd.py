"""`tpuflow reap [--dry-run] [--older-than 2h]`: delete what finished, killed or expired runs left behind.

What a keep_endpoint run kept (labelled tpuflow-kept=true; a local cluster's state "kept") is never deleted:
each run says how many it skipped. Delete a kept endpoint with kubectl / gcloud / `tpuflow local down` (the
commands: the tpuflow.cost.reaper docstring, or docs/cost-and-goodput.md, Orphan reaper).

Without an Airflow metadata DB (a plain shell after `tpuflow demo`; or --without-db) no run state can be read:
resources are then judged by the process that supervised their run (a `tpuflow demo`, `tpuflow run`, an
`airflow dags test`): every local cluster, slice lease, node pool, RayCluster and RayService of a run whose
supervisor is provably dead (exited, its pid reused, its host rebooted) is reaped at once, whatever its age, and
the chip time of its node pools is booked in RUN/reaped_ledger.json. With a DB, such a resource is reaped too even
while the DB still lists its run as running.

Where to look on GKE: the flags, else the GKE pipeline's Variables as this shell exports them (AIRFLOW_VAR_*, what
`tpuflow standins env` prints; AIRFLOW_VAR_TPUFLOW_BACKEND=gke): the cluster, the Kubernetes connection, and the
lease root beside the output root (OUTPUT_ROOT/_tpuflow/slice-leases) where each run records its supervisor.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuflow.cost.reaper import RunStates


def _run_states(without_db: bool) -> RunStates:
    """The metadata DB's running runs; without one, run states that cover no DAG (only what is provably
    over is reaped: a dead supervisor, an expiry, processes gone)."""
    from tpuflow.cost.reaper import FixedRunStates, MetadataDbRunStates

    if not without_db:
        try:
            return FixedRunStates(MetadataDbRunStates().running())
        except Exception as err:  # no DB configured, not migrated, unreachable
            text = (str(err).strip().splitlines() or [type(err).__name__])[0]
            print(
                f"tpuflow reap: no Airflow metadata DB to read ({text}); judging runs by the process that "
                "supervised them (and resources by their expiry)",
                file=sys.stderr,
            )
    return FixedRunStates({}, dag_ids=[])


def _variable(name: str, default: str = "") -> str:
    """An Airflow Variable as this shell gives it (``AIRFLOW_VAR_<NAME>``, what `tpuflow standins env` exports)."""
    return os.environ.get(f"AIRFLOW_VAR_{name.upper()}", "").strip() or default


def _configured_gke(args: argparse.Namespace) -> dict[str, Any] | None:
    """The GKE cluster, connections, output root and lease root the GKE pipeline's Variables name
    (tpuflow.pipeline.gke.variable_settings), each flag given overriding its Variable; None when this shell
    configures no GKE backend and no flag names a cluster."""
    from tpuflow import paths

    flags = (args.project, args.location, args.cluster, args.kubernetes_conn_id)
    if _variable("tpuflow_backend").lower() != "gke" and not any(flags):
        return None
    gcp = args.gcp_conn_id or _variable("tpuflow_gcp_conn_id", "google_cloud_default")
    project = args.project or _variable("tpuflow_gke_project") or _connection_project(gcp)
    # the GKE DAG's own default when the Variable is not set (tpuflow.pipeline.gke.variable_settings)
    output_root = args.output_root or _variable("tpuflow_gke_output_root") or str(paths.output_root())
    return {
        "gcp_conn_id": gcp,
        "project_id": project or None,
        "location": args.location or _variable("tpuflow_gke_location", "us-east5-b"),
        "cluster_name": args.cluster or _variable("tpuflow_gke_cluster", "tpuflow"),
        "kubernetes_conn_id": args.kubernetes_conn_id or _variable("tpuflow_kubernetes_conn_id") or None,
        "namespace": args.namespace or _variable("tpuflow_kuberay_namespace") or None,
        "output_root": output_root,
        "lease_root": args.lease_root or paths.gke_lease_root(output_root),
    }


def _connection_project(gcp_conn_id: str) -> str:
    """The GCP connection's ``project`` extra (where the GKE DAG takes the project from), or ''."""
    try:
        from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

        return GoogleBaseHook(gcp_conn_id=gcp_conn_id).project_id or ""
    except Exception:  # no such connection: the project must then be given
        return ""


def _scopes(args: argparse.Namespace) -> list[tuple[Any, str | None]]:
    """(ReaperScope, output root of its runs) for each place to look: the configured GKE cluster and its lease
    root, then this machine's local clusters and leases."""
    from tpuflow import paths
    from tpuflow.cost.reaper import ReaperScope

    scopes: list[tuple[Any, str | None]] = []
    gke = _configured_gke(args)
    if gke is not None:
        output_root = gke.pop("output_root")
        scopes.append((ReaperScope(**gke, local=False, leases=gke["lease_root"] is not None), output_root))
    local = ReaperScope(
        gcp_conn_id=args.gcp_conn_id or "google_cloud_default",
        kube=False,
        local_base_dir=args.base_dir,
        lease_root=None if gke is not None else args.lease_root,
    )
    scopes.append((local, args.output_root or str(paths.output_root())))
    return scopes


def _reap(args: argparse.Namespace) -> int:
    from tpuflow.cost.reaper import ReaperListError, collect_orphans, parse_duration, reap, settle_dead_runs

    older_than = parse_duration(args.older_than)
    states = _run_states(args.without_db)
    failed = False
    for scope, output_root in _scopes(args):
        if scope.gke:
            print(f"tpuflow reap: GKE cluster {scope.cluster_name} ({scope.project_id}, {scope.location})")
        try:
            orphans = collect_orphans(scope, states, older_than=older_than)
        except ReaperListError as err:
            print(f"tpuflow reap: nothing deleted: {err}", file=sys.stderr)
            return 1
        outcome = reap(orphans, dry_run=args.dry_run)
        settle_dead_runs(orphans, outcome, output_root=output_root, gcp_conn_id=scope.gcp_conn_id)
        failed = failed or bool(outcome["failed"])
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    parser.add_argument(
        "--gcp-conn-id",
        default=None,
        help="Airflow connection for the GKE API (default: the Variable, else google_cloud_default)",
    )
    parser.add_argument(
        "--output-root",
        default=None,
        help="where runs write (a killed run's ledger goes to ROOT/DAG/DATE/reaped_ledger.json); default: the Variable",
    )
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
