"""The Ray layer every Ray-facing product builds on: where a cluster's dashboard is, how to authenticate to
it (``connection``), and the links to it (``links``). Jobs (``tpuflow.rayjob``), Serve (``tpuflow.serve``),
KubeRay (``tpuflow.kuberay``) and the local cluster (``tpuflow.local``) import it; it imports none of them."""
