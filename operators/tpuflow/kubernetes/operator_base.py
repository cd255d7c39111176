"""The operator skeleton every Kubernetes-object operator shares (KubeRay's, capacity's): where the
Kubernetes API is, how long to wait, and one argument-check shape (run on static values at parse time and
on rendered values at the start of execute); and the deterministic name and owner record of the object a
task instance makes.

Cheap to import: the hooks (kubernetes, providers) load inside the methods that run in the worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.docstrings import InheritedParamDocs
from tpuflow.errors import UserInputError
from tpuflow.kubernetes.values import check_namespace
from tpuflow.validation import check_count, check_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.kubernetes.hooks import KubeObjectsHook, KubeTarget

GKE_CLUSTER_KEYS = ("project_id", "location", "cluster_name")


def check_gke_cluster(gke_cluster: Mapping[str, Any] | None) -> None:
    if gke_cluster is None:
        return
    if not isinstance(gke_cluster, Mapping):
        raise UserInputError("gke_cluster", gke_cluster, f"give a mapping with {', '.join(GKE_CLUSTER_KEYS)}")
    missing = [k for k in GKE_CLUSTER_KEYS if not gke_cluster.get(k)]
    if missing:
        raise UserInputError(
            "gke_cluster", gke_cluster, f"give {', '.join(GKE_CLUSTER_KEYS)} (missing: {', '.join(missing)})"
        )


def check_choice(field: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise UserInputError(field, value, f"use one of {', '.join(choices)}")


class KubernetesBaseOperator(InheritedParamDocs, ArgumentChecks, BaseOperator):
    """Where the Kubernetes API is, how long to wait, and the argument checks.

    :param kubernetes_conn_id: a ``kubernetes`` connection (kube_config_path / kube_config / in_cluster
        extras). Default: ``kubernetes_default`` unless ``gke_cluster`` is given; templated.
    :param gke_cluster: ``{"project_id", "location", "cluster_name"}`` (optional ``use_internal_ip``,
        ``use_dns_endpoint``). Alone, the operator reaches the cluster through the google provider's GKE
        hooks; with ``kubernetes_conn_id`` it only feeds the console links; templated.
    :param gcp_conn_id: the Google Cloud connection for ``gke_cluster``; templated.
    :param impersonation_chain: service account(s) the GKE hooks impersonate.
    :param namespace: Kubernetes namespace; default: the connection's ``namespace`` extra, else "default";
        templated.
    :param deferrable: wait in the triggerer (status polling with kubernetes_asyncio).
    :param poll_interval: seconds between status reads.
    :param wait_timeout: seconds until the task fails with the object's last word and diagnostics.
    :param log_lines: pod log lines to include on failure or timeout.
    """

    template_fields: Sequence[str] = ("namespace", "kubernetes_conn_id", "gke_cluster", "gcp_conn_id")

    def __init__(
        self,
        *,
        namespace: str | None = None,
        kubernetes_conn_id: str | None = None,
        gke_cluster: Mapping[str, Any] | None = None,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        wait_timeout: float = 1800.0,
        log_lines: int = 50,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.namespace = namespace
        self.kubernetes_conn_id = kubernetes_conn_id
        self.gke_cluster = gke_cluster
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.wait_timeout = wait_timeout
        self.log_lines = log_lines
        self._hook_cache: KubeObjectsHook | None = None
        self._target_cache: KubeTarget | None = None

    # --- argument checks: one validation function, two moments ---
    def argument_checks(self) -> list[ArgumentCheck]:
        """Every check of this operator's arguments, with the values it reads (subclasses extend it)."""
        return [
            ((self.gke_cluster,), lambda: check_gke_cluster(self.gke_cluster)),
            ((self.poll_interval,), lambda: check_seconds("poll_interval", self.poll_interval)),
            ((self.wait_timeout,), lambda: check_seconds("wait_timeout", self.wait_timeout)),
            ((self.log_lines,), lambda: check_count("log_lines", self.log_lines, minimum=0)),
            # empty (a Variable left unset) means the connection's namespace, as resolve_namespace() reads it
            ((self.namespace,), lambda: not self.namespace or check_namespace(self.namespace)),
        ]

    # --- Kubernetes access (worker side) ---
    def kube_target(self) -> KubeTarget:
        if self._target_cache is None:
            self._target_cache = _target(
                self.kubernetes_conn_id, self.gke_cluster, self.gcp_conn_id, self.impersonation_chain
            )
        return self._target_cache

    def configured_access(self, context: Context) -> tuple[KubeObjectsHook, KubeTarget, str]:
        """The hook, target and namespace this task's own arguments name, rendered for ``context``: how another
        task of the run reaches what this task made without taking where or how from its XCom."""
        target = _target(
            self.render_template(self.kubernetes_conn_id, context),
            self.render_template(self.gke_cluster, context),
            self.render_template(self.gcp_conn_id, context),
            self.impersonation_chain,
        )
        hook = self.hook_class().for_target(target)
        namespace = self.render_template(self.namespace, context)
        return hook, target, check_namespace(namespace or hook.default_namespace())

    def hook_class(self) -> type[KubeObjectsHook]:
        """The product's hook (a KubeObjectsHook subclass with its API group); imported in the worker only."""
        from tpuflow.kubernetes.hooks import KubeObjectsHook

        return KubeObjectsHook

    def kube_hook(self) -> KubeObjectsHook:
        if self._hook_cache is None:
            self._hook_cache = self.hook_class().for_target(self.kube_target())
        return self._hook_cache

    def resolve_namespace(self) -> str:
        return check_namespace(self.namespace or self.kube_hook().default_namespace())


def _target(
    kubernetes_conn_id: str | None,
    gke_cluster: Mapping[str, Any] | None,
    gcp_conn_id: str,
    impersonation_chain: str | Sequence[str] | None,
) -> KubeTarget:
    from tpuflow.kubernetes.hooks import KubeTarget, resolve_gke_target

    if gke_cluster and not kubernetes_conn_id:
        return resolve_gke_target(gke_cluster, gcp_conn_id, impersonation_chain)
    return KubeTarget(kubernetes_conn_id=kubernetes_conn_id or "kubernetes_default")
