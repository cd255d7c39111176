"""`tpuflow render nodepool`: the GKE CreateNodePool request body for a TPU slice.

With --json it prints ``{"nodePool": {...}}`` in the GKE v1 REST form (camelCase fields, enum values
by name, as in the GKE reference; the Python client sends the same message with enums as numbers).
A multi-host request with --num-slices N > 1 needs N pools (GKE cannot grow a multi-host pool), so
then it prints a JSON list of N bodies. Pass --dag-id/--run-id/--task-id to get the node pool name
and ownership labels GKECreateTPUNodePoolOperator would use for that task instance.

A multi-host tpu7x slice without --workload-policy is placed by the HIGH_THROUGHPUT workload policy the
operator makes for its topology (Compute API, before the pools): then --json prints
``{"resourcePolicy": {...}, "nodePool": {...}}`` (``"nodePools": [...]`` for several slices), the
ResourcePolicy insert body first.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from tpuflow.cli.slice_cmd import add_identity_arguments, add_slice_arguments, identity_from_args
from tpuflow.gke.nodepool_spec import plan_node_pools
from tpuflow.gke.workload_policy import COMPUTE_API
from tpuflow.kubernetes.values import parse_key_values
from tpuflow.validation import check_number, check_whole_seconds


def _max_run_s(value: str | None, expires_after_hours: float) -> int | None:
    """--max-run-duration: seconds, or "none"; default: the expiry's span, as the create operator does."""
    if value is None:
        return math.ceil(expires_after_hours * 3600)
    if value.strip().lower() == "none":
        return None
    return check_whole_seconds("--max-run-duration", value, fix="give whole seconds > 0, or none for no limit")


def _run(args: argparse.Namespace) -> int:
    identity = identity_from_args(args)
    hours = check_number("--expires-after-hours", args.expires_after_hours, minimum=0, maximum=366 * 24, above=True)
    plan = plan_node_pools(
        project_id=args.project,
        location=args.location,
        cluster_name=args.cluster,
        accelerator=args.accelerator,
        topology=args.topology,
        machine_type=args.machine_type,
        num_slices=args.num_slices,
        capacity=args.capacity,
        node_zone=args.node_zone,
        node_pool_name=args.node_pool_name,
        node_labels=parse_key_values("--node-label", args.node_label),
        node_taints=args.node_taint,
        service_account=args.service_account,
        workload_policy=args.workload_policy,
        identity=identity,
        expires_at=int(time.time() + hours * 3600) if identity else None,
        max_run_duration_s=_max_run_s(args.max_run_duration, hours),
    )
    bodies = [{"nodePool": body} for body in plan.bodies()]
    made = plan.made_workload_policy
    if args.json:
        if made is None:
            print(json.dumps(bodies[0] if len(bodies) == 1 else bodies, indent=2))
        else:
            pools = bodies[0] if len(bodies) == 1 else {"nodePools": bodies}
            print(json.dumps({"resourcePolicy": made.body(), **pools}, indent=2))
        return 0
    tpu = plan.tpu
    if made is not None:
        print(f"POST {COMPUTE_API}/{made.parent}/resourcePolicies: {json.dumps(made.body())}")
        print(f"  (made by the create task before its pools, deleted after them; by hand: {made.gcloud()})")
    for body in plan.bodies():
        placement = body.get("placementPolicy") or "none (single-host)"
        print(
            f"POST https://container.googleapis.com/v1/{plan.parent}/nodePools: {body['name']} = "
            f"{plan.nodes_per_pool} x {tpu.machine_type} in {plan.node_zone}, placement {placement}, "
            f"capacity {plan.capacities[0]}"
        )
    print(tpu.summary())
    return 0


def register(renderers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = renderers.add_parser(
        "nodepool",
        help="the GKE node pool request body for a TPU slice",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--project", required=True, help="Google Cloud project ID")
    parser.add_argument("--location", required=True, help="the cluster's zone (or region, with --node-zone)")
    parser.add_argument("--cluster", required=True, help="GKE cluster name")
    add_slice_arguments(parser)
    parser.add_argument(
        "--capacity", default="on-demand", help="on-demand (default), spot, reservation:NAME, flex-start or queued"
    )
    parser.add_argument("--node-zone", default=None, help="zone of the slice when --location is a region")
    parser.add_argument("--node-pool-name", default=None, help="default: derived (see --task-id)")
    parser.add_argument("--workload-policy", default=None, help="workload policy name (multi-host tpu7x)")
    parser.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE", help="node label (repeat)")
    parser.add_argument("--node-taint", action="append", default=[], metavar="KEY=VALUE:EFFECT", help="taint (repeat)")
    parser.add_argument("--service-account", default=None, help="node service account email")
    add_identity_arguments(parser)
    parser.add_argument("--expires-after-hours", type=float, default=24.0)
    parser.add_argument(
        "--max-run-duration",
        default=None,
        metavar="SECONDS",
        help="GKE deletes each node this long after it started (config.maxRunDuration); default: the expiry's "
        "span; none: no limit",
    )
    parser.add_argument("--json", action="store_true", help="print the request body as JSON")
    parser.set_defaults(func=_run)
