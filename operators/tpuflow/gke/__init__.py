"""GKE TPU slice node pools: request bodies (nodepool_spec), error classification (errors), the hook
(hooks), deferral triggers (triggers), console links (links) and the operators (operators).

Kept free of imports: the CLI and DAG files import submodules directly, e.g.
``from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator``.
"""
