"""A simulated KubeRay operator (plus GKE's TPU webhook) reconciling objects in the Kubernetes stand-in.

RayCluster: the TPU webhook rule is enforced at admission (numOfHosts vs topology; the webhook module
plays GKE's webhook from its documentation, not from the operators' pre-flight check), and its pod
mutation sets TPU_WORKER_ID / TPU_NAME / TPU_WORKER_HOSTNAMES. The controller
creates the head pod, one pod per TPU host (replicas x numOfHosts) and the head Service. TPU worker pods
are scheduled only when the node-pool directory (the GKE stand-in) reports enough free nodes with the
worker group's node-selector labels; otherwise they stay Pending with a FailedScheduling event as on
GKE. Once every pod can be scheduled the controller launches a real Ray cluster through a
`ClusterLauncher` (normally tpuflow_rehearsal.ray_launcher's, which starts the embedded `LocalRayCluster`: a
head plus one simulated TPU host per pod, built from the worker group's SliceShape: nodeSelector labels,
google.com/tpu and numOfHosts) and reports KubeRay's status:
conditions RayClusterProvisioned / HeadPodReady, ready/desired worker replicas, status.head and
status.endpoints.

Addresses: the stand-in's pod network is the loopback interface. Every Ray head listens on free local
ports, so the head Service and status.endpoints carry those port numbers (where a real cluster has
8265/8000/6379) and status.head.podIP / serviceIP are 127.0.0.1: reading the head Service from outside
gives a reachable address, which is what a port-forward gives on GKE.

RayService: creates an owned RayCluster "<name>-raycluster-<hash>", PUTs serveConfigV2 to its dashboard
(/api/serve/applications/, as KubeRay does; http_options rewritten to the local serve port), mirrors
Serve's application and deployment statuses into activeServiceStatus and sets Ready when every app is
RUNNING and a proxy is healthy. serveConfigV2 changes are applied in place; rayClusterConfig changes
start a pending cluster only for upgradeStrategy NewCluster*, which needs a second set of TPU nodes.

Deletion: RayClusters carry a stand-in finalizer so the object disappears only after the Ray processes
stopped ("delete and wait until gone" is observable); owned pods/services/clusters are
garbage-collected through ownerReferences.

The stand-in imports nothing from the operator side (tests/rehearsal/standins/test_independence.py): its
readiness, webhook and TPU knowledge are its own (webhook, ../gke_tpu).

Modules: seams (NodePoolDirectory, StaticNodePools, GkeNodePools, LaunchSpec, RayClusterHandle,
ClusterLauncher), launchers (FakeRayLauncher; LocalRayLauncher lives in tpuflow_rehearsal.ray_launcher),
webhook (the GKE TPU webhook), reconciler (KubeRayController), services (RayService reconciliation), standin (KubeRayStandin, the command line:
``python -m tpuflow_rehearsal.standins.kuberay_controller --workdir DIR [--gke-url URL] [--fake]``).
"""

from tpuflow_rehearsal.ray_launcher import LocalRayHandle, LocalRayLauncher
from tpuflow_rehearsal.standins.kuberay_controller.launchers import FakeRayHandle, FakeRayLauncher, FakeServeBehaviour
from tpuflow_rehearsal.standins.kuberay_controller.reconciler import FINALIZER, KubeRayController
from tpuflow_rehearsal.standins.kuberay_controller.seams import (
    ClusterLauncher,
    GkeNodePools,
    LaunchSpec,
    NodePoolDirectory,
    RayClusterHandle,
    StaticNodePools,
)
from tpuflow_rehearsal.standins.kuberay_controller.standin import KubeRayStandin, main
from tpuflow_rehearsal.standins.kuberay_controller.webhook import tpu_webhook

__all__ = [
    "FINALIZER",
    "ClusterLauncher",
    "FakeRayHandle",
    "FakeRayLauncher",
    "FakeServeBehaviour",
    "GkeNodePools",
    "KubeRayController",
    "KubeRayStandin",
    "LaunchSpec",
    "LocalRayHandle",
    "LocalRayLauncher",
    "NodePoolDirectory",
    "RayClusterHandle",
    "StaticNodePools",
    "main",
    "tpu_webhook",
]
