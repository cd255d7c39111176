"""Stand-ins that behave like the cloud services tpuflow drives, so the GKE pipeline runs locally.

- gke_api: a loopback GKE v1 API (node pools, operations) with GKE's TPU validation and wording;
  gcloud reaches it through CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER.
- kubernetes_api: a loopback Kubernetes API server over HTTPS (custom objects, pods, logs, services,
  events; discovery, OpenAPI v3, tables, watch, server-side apply) for the python clients and kubectl;
  kubernetes_catalog holds what it publishes about its types, tls its throw-away CA.
- kuberay_controller: a simulated KubeRay operator (and GKE's TPU webhook) reconciling RayClusters
  into real local Ray clusters and RayServices into Serve deployments on them.
- stack: all of them as one fake GKE cluster (`tpuflow standins up`, `tpuflow demo --backend gke`).
"""
