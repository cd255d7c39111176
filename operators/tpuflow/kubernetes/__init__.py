"""The Kubernetes layer GKE, capacity, KubeRay and the Ray layer build on: where the API is and how to reach
it (``hooks``: ``KubeTarget``, custom objects of one API group, pods, logs, Secrets, events), what an API
error means (``errors``), the value rules of a manifest (``values``) and the operator skeleton every
Kubernetes-object operator shares (``operator_base``). It imports no product package."""
