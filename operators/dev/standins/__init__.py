"""Stand-ins that behave like the cloud services tpuflow drives, so the GKE pipeline runs locally.

- kubernetes_api: a loopback Kubernetes API server (custom objects, pods, logs, services, events).
- kuberay_controller: a simulated KubeRay operator (and GKE's TPU webhook) reconciling RayClusters
  into real local Ray clusters and RayServices into Serve deployments on them.
"""
