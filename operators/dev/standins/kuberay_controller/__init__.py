"""A simulated KubeRay operator (plus GKE's TPU webhook) reconciling objects in the Kubernetes stand-in.

RayCluster: the TPU webhook rule is enforced at admission (numOfHosts vs topology). The controller
creates the head pod, one pod per TPU host (replicas x numOfHosts) and the head Service. TPU worker pods
are scheduled only when the node-pool directory (the GKE stand-in) reports enough free nodes with the
worker group's node-selector labels; otherwise they stay Pending with a FailedScheduling event as on
GKE. Once every pod can be scheduled the controller launches a real Ray cluster through a
`ClusterLauncher` (normally the embedded `LocalRayCluster`: a head plus one simulated TPU host per pod,
built from the nodeSelector labels, google.com/tpu and numOfHosts) and reports KubeRay's status:
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

Modules: seams (NodePoolDirectory, StaticNodePools, GkeNodePools, LaunchSpec, RayClusterHandle,
ClusterLauncher), launchers (LocalRayLauncher, FakeRayLauncher), reconciler (KubeRayController,
tpu_webhook), services (RayService reconciliation), standin (KubeRayStandin, the command line:
``python -m tpuflow.dev.standins.kuberay_controller --workdir DIR [--gke-url URL] [--fake]``).
"""

from tpuflow.dev.standins.kuberay_controller.launchers import (
    FakeRayHandle,
    FakeRayLauncher,
    FakeServeBehaviour,
    LocalRayHandle,
    LocalRayLauncher,
)
from tpuflow.dev.standins.kuberay_controller.reconciler import FINALIZER, KubeRayController, tpu_webhook
from tpuflow.dev.standins.kuberay_controller.seams import (
    ClusterLauncher,
    GkeNodePools,
    LaunchSpec,
    NodePoolDirectory,
    RayClusterHandle,
    StaticNodePools,
)
from tpuflow.dev.standins.kuberay_controller.standin import KubeRayStandin, main

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
