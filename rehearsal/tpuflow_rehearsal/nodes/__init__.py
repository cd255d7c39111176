"""What GKE plays around the real control plane of the rehearsal (issue 46): its nodes and add-ons.

Modules: agent (``NodeAgent``: the loop that registers Nodes, runs and reports pods, mirrors Services), node_registry
(the Nodes of the GKE stand-in's pools, heartbeats), network (a network namespace per pod on a bridge; cluster names
in each pod's /etc/hosts), pod_runner (one pod's containers as processes, probes, restarts, status), pod_env (the
kubelet's env resolution; the TPU VM's metadata), service_proxy and tcp_forward (Service addresses, as kube-proxy),
kube_rest (the agent's API client), tpu_webhook (GKE's KubeRay TPU webhook over HTTPS).
"""
