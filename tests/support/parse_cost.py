"""What DAG parsing must not load: the list the DAG-file tests and the function-level import rule share."""

from __future__ import annotations

# What a DAG file must not load while the dag processor parses it (a fresh interpreter with airflow.sdk
# already imported, as the dag processor has). Prefixes: "ray" also covers "ray.train" and so on.
HEAVY = (
    # ML stacks and Ray: only inside Ray jobs and tasks
    "ray",
    "jax",
    "torch",
    "optax",
    "flax",
    "numpy",
    "pyarrow",
    # cloud and Kubernetes clients, HTTP clients: only in hooks, triggers and execute()
    "kubernetes",
    "kubernetes_asyncio",
    "google.cloud",
    "google.auth",
    "googleapiclient",
    "grpc",
    "aiohttp",
    "requests",
    # TaskFlow (@task): it loads the standard provider's PythonOperator, virtualenv helpers and packaging,
    # once about half of these DAGs' parse cost; the pipeline's own steps are plain operators instead
    "airflow.sdk.definitions.decorators",
    "airflow.providers.standard.operators.python",
    # the project's worker-side modules: hooks, triggers, waits, and the builders and the slice arithmetic
    # that the operators load when they check or build something (the shipped DAGs template those values)
    "tpuflow.gke.hooks",
    "tpuflow.gke.triggers",
    "tpuflow.gke.provisioning",
    "tpuflow.gke.nodepool_spec",
    "tpuflow.kuberay.hooks",
    "tpuflow.kuberay.triggers",
    "tpuflow.kuberay.waits",
    "tpuflow.kuberay.manifests",
    "tpuflow.kuberay.webhook_rules",
    "tpuflow.rayjob.hooks",
    "tpuflow.rayjob.triggers",
    "tpuflow.rayjob.waits",
    "tpuflow.serve.hooks",
    "tpuflow.serve.config",
    "tpuflow.serve.triggers",
    "tpuflow.slices.leases",
    "tpuflow.local.cluster",
    "tpuflow.tpu.slice",
)
