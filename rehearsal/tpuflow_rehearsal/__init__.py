"""Development and rehearsal tools: nothing in the provider imports this package.

- ``tpuflow_rehearsal.standins``: loopback stand-ins of the GKE and Kubernetes APIs and a simulated
  KubeRay controller (with the GKE TPU webhook), implementing the documented behaviour of those
  services on their own, so the operators can be driven against them by the real clients.
- ``tpuflow_rehearsal.airflow_services``: a real local Airflow (api-server, scheduler, dag-processor,
  triggerer) for rehearsing DAG runs.
- ``tpuflow_rehearsal.demo``: ``tpuflow demo``, the local pipeline end to end.
"""
