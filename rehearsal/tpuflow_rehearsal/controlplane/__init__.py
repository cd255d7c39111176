"""The real control plane of the GKE rehearsal (issue 46): etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the KubeRay operator built from Go modules (``controlplane/`` at the repository root), started
on loopback ports and stopped by PID.

Modules: binaries (where the built binaries are; building them), pki (the CA, serving certificates,
service-account key and static tokens), cluster (``ControlPlane``: start, stop, restart or kill a component).
"""
