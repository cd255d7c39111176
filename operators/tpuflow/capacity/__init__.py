"""Capacity that is queued or bounded in time, on top of GKE and the Kubernetes layer: a ProvisioningRequest
(``provisioning_request``: the plan and GKE's verdict), its hook, triggers and operators (queued
provisioning, flex-start). Node pools and their workload policies are tpuflow.gke's."""
