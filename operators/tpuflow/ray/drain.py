"""A host's preemption notice, as Ray learns of one: the node drained with reason PREEMPTION and a deadline.

Ray Train watches for such drains (``ray.train.get_preemption_info``) and restarts from the latest
checkpoint at the deadline. On GKE nothing drains a Ray node when a spot TPU VM gets its termination
notice: GKE's graceful node shutdown only terminates the node's pods (15 s of its default 30 s for
ordinary pods, up to 120 s when configured). The KubeRay TPU worker pods therefore carry a preStop hook
(`prestop_hook`) that drains their own Ray node and keeps it up for the notice; the local cluster's
`tpuflow local preempt --notice` runs the same command (`drain_node_args`) before it kills the host.
"""

from __future__ import annotations

import shlex
from typing import Any

PREEMPTION_REASON = "DRAIN_NODE_REASON_PREEMPTION"
# what GKE's graceful node shutdown gives ordinary pods of a spot VM by default (30 s, half for system pods)
GKE_SPOT_POD_NOTICE_S = 15


def drain_node_args(
    notice_s: int, reason_message: str, node_id: str | None = None, address: str | None = None
) -> list[str]:
    """The `ray` CLI's arguments that drain a node for preemption with ``notice_s`` seconds to its deadline.

    Without ``node_id``, Ray drains the node the command runs on; without ``address``, RAY_ADDRESS's
    cluster (KubeRay sets it in every Ray container).
    """
    args = [
        "drain-node",
        f"--reason={PREEMPTION_REASON}",
        f"--reason-message={reason_message}",
        f"--deadline-remaining-seconds={int(notice_s)}",
    ]
    if node_id:
        args.append(f"--node-id={node_id}")
    if address:
        args.append(f"--address={address}")
    return args


# Whether this VM is going away, from the GCE metadata server (what GKE's node termination handler read;
# GCE_METADATA_HOST overrides its host, as in google-auth): exit 0 when the VM is being preempted or stopped
# for maintenance, or when the server cannot say; 1 when it says the VM stays.
VM_GOING_SCRIPT = """import os, urllib.request as u
host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
def get(key):
    req = u.Request(f"http://{host}/computeMetadata/v1/instance/{key}", headers={"Metadata-Flavor": "Google"})
    return u.urlopen(req, timeout=2).read().decode().strip()
try:
    going = get("preempted") == "TRUE" or get("maintenance-event").startswith("TERMINATE")
except Exception:
    going = True
raise SystemExit(0 if going else 1)
"""


def prestop_hook(notice_s: int) -> dict[str, Any]:
    """A TPU worker container's ``lifecycle.preStop``: when the VM is going, drain this Ray node and hold it
    up for the notice.

    Kubernetes sends SIGTERM only when the hook returns; without the wait the raylet would exit at once and
    the workers with it, before their just-in-time checkpoint. A pod deleted while its VM stays (the
    RayCluster torn down) ends at once: the metadata server says the VM is not preempted. A drain that
    fails (the head unreachable) still waits: the pod is going either way.
    """
    drain = shlex.join(["ray", *drain_node_args(notice_s, "the TPU VM is being preempted (GKE node shutdown)")])
    check = shlex.join(["python", "-c", VM_GOING_SCRIPT])
    return {"exec": {"command": ["/bin/sh", "-c", f"{check} || exit 0; {drain} || true; sleep {int(notice_s)}"]}}
