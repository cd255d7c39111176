"""Which Ray cluster a task uses comes from XCom; where it is and with what credential never do.

A Ray operator's ``cluster`` is usually the start task's XCom (``start.output``, or a template pulling it).
Airflow lets a user who may write XComs rewrite a running run's XComs through the REST API, so the payload is
read as a *reference* only: the start task that produced it (found in the DAG file, which only its author
writes) re-derives the addresses, the token's location and the state folder from its own arguments and
connections, for the object that task instance made (judged by the owner record it wrote: dag, run, task, map
index). A payload whose addresses or credential references differ from that is refused with one line. A
``cluster`` dict written in the DAG file itself is configuration and is used as given.

The start operators implement ``ClusterSource``; this module sits below them (tpuflow.local, tpuflow.kuberay)
and only knows the protocol.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tpuflow.errors import UserInputError

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context

# What says where a cluster is or with what credential to reach it: never taken from XCom.
AUTHORITY_KEYS = (
    "dashboard_url",
    "serve_url",
    "metrics_url",
    "gcs_address",
    "client_address",
    "auth_token_path",
    "ray_auth",
    "state_dir",
    "python",
    "in_cluster_dns",
)
_PULLED_TASK = re.compile(r"""xcom_pull\(\s*(?:task_ids\s*=\s*)?['"]([^'"]+)['"]""")


class ClusterTampered(UserInputError):
    """The cluster payload names addresses or credentials its start task did not record."""


@runtime_checkable
class ClusterSource(Protocol):
    """A task whose XCom is a Ray cluster's connection info, and which can say again, from its own
    arguments and connections, what that info is for the object its task instance made."""

    task_id: str

    def cluster_from_reference(self, reference: Mapping[str, Any], context: Context) -> dict[str, Any]:
        """The connection info of the cluster ``reference`` names, derived from this task's configuration;
        raise ClusterTampered when ``reference`` names an object this task instance did not make."""
        ...


def cluster_source_task(cluster: object) -> str | None:
    """The id of the task whose XCom a ``cluster`` argument is (read before templating): an XComArg's
    operator, or the task a template's ``xcom_pull`` names; None for a value the DAG's author sourced
    otherwise (written in the DAG file, a Variable, a Param they chose to let the trigger set)."""
    from airflow.sdk.definitions.xcom_arg import PlainXComArg

    if isinstance(cluster, PlainXComArg):
        return str(cluster.operator.task_id)
    if isinstance(cluster, str) and (found := _PULLED_TASK.search(cluster)):
        return found.group(1)
    return None


def trusted_cluster(
    consumer: BaseOperator, cluster: Any, source_task_id: str | None, context: Context
) -> dict[str, Any] | None:
    """``cluster`` (rendered) as its start task re-derives it; unchanged when it was written in the DAG file
    (``source_task_id`` None) or is empty (a ``ray_conn_id`` names the cluster)."""
    if source_task_id is None or not cluster:
        return dict(cluster) if isinstance(cluster, Mapping) else None
    if not isinstance(cluster, Mapping):
        raise UserInputError("cluster", cluster, "pass the cluster-start task's XCom (a dict)")
    producer = _source(consumer, source_task_id)
    if producer is None:
        raise UserInputError(
            "cluster",
            source_task_id,
            "a Ray operator's cluster must be the XCom of a tpuflow cluster-start task (its addresses and token "
            "are derived from that task's own arguments); name other clusters with ray_conn_id",
        )
    trusted = producer.cluster_from_reference(cluster, context)
    changed = sorted(k for k in AUTHORITY_KEYS if k in cluster and cluster[k] != trusted.get(k))
    if changed:
        raise ClusterTampered(
            f"cluster[{changed[0]!r}]",
            _shown(cluster[changed[0]]),
            f"the XCom of task {source_task_id} no longer matches the cluster that task made "
            f"({', '.join(changed)} changed after it was written); clear {source_task_id} to start it again",
        )
    return trusted


def _source(consumer: BaseOperator, task_id: str) -> ClusterSource | None:
    """The task of ``consumer``'s DAG (the file its author wrote) whose XCom names the cluster, when it is ours."""
    producer = consumer.dag.task_dict.get(task_id) if consumer.dag is not None else None
    return producer if isinstance(producer, ClusterSource) else None


def _shown(value: Any) -> Any:
    """A changed value as the error line shows it: a credential reference by its name only."""
    if isinstance(value, Mapping):
        return {k: value[k] for k in ("secret_name", "namespace") if k in value} or "{...}"
    return value


def check_url_of_source(consumer: BaseOperator, url: str, source_task_id: str | None, context: Context) -> None:
    """A URL templated from a task's XCom that a credential will be sent to: it must lie under the serve_url
    that task re-derives (``cluster_from_reference``); ClusterTampered otherwise."""
    if source_task_id is None:
        return
    producer = _source(consumer, source_task_id)
    if producer is None:
        raise UserInputError(
            "url",
            url,
            f"a bearer token is only sent to an endpoint a tpuflow deploy task made; {source_task_id} is not one "
            "(write the URL in the DAG, or take it from the deploy task's XCom)",
        )
    reference = context["ti"].xcom_pull(task_ids=source_task_id)
    trusted = producer.cluster_from_reference(reference if isinstance(reference, Mapping) else {}, context)
    base = str(trusted.get("serve_url") or "").rstrip("/")
    if not base or not (url == base or url.startswith(f"{base}/")):
        raise ClusterTampered(
            "url",
            url,
            f"task {source_task_id} serves at {base or 'no URL'}; its XCom was changed after it was written: clear "
            f"{source_task_id} to deploy again",
        )
