"""Which Ray cluster a task uses comes from XCom; where it is and with what credential never do.

A Ray operator's ``cluster`` is usually the start task's XCom (``start.output``, or a template pulling it).
Airflow lets a user who may write XComs rewrite a running run's XComs through the REST API, so the payload is
read as a *reference* only: the start task that produced it (found in the DAG file, which only its author
writes) re-derives the addresses, the token's location and the state folder from its own arguments and
connections, for the object that task instance made (judged by the owner record it wrote: dag, run, task, map
index). A payload whose credential references or state folder differ from that is refused with one line; its
addresses are never used, the cluster's current ones are (a KubeRay head pod replaced after its node died answers
at a new address, which the start task's XCom cannot know). A
``cluster`` dict written in the DAG file itself is configuration and is used as given.

Mapping: a consumer expanded over the start task's XCom (``.expand(cluster=start.output)``) is created at run time
with the resolved dict, so its source is read from the mapped definition in the DAG file, not from its arguments.
A mapped start task (or one in a mapped TaskGroup) made one cluster per map index: the consumer's own map index
says which; an unmapped start task made one, whatever the consumer's map index.

The start operators implement ``ClusterSource``; this module sits below them (tpuflow.local, tpuflow.kuberay)
and only knows the protocol.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from tpuflow.errors import UserInputError

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context

# Where a cluster is: never taken from XCom, always read again from the cluster; a KubeRay head replaced after its
# node died answers at a new pod address, so a different one in the XCom is not by itself a rewrite.
ADDRESS_KEYS = ("dashboard_url", "serve_url", "metrics_url", "gcs_address", "client_address", "in_cluster_dns")
# With what credential, and what local state, a cluster is reached: these never change for one cluster.
CREDENTIAL_KEYS = ("auth_token_path", "ray_auth", "state_dir", "python")
_PULLED_TASK = re.compile(r"""xcom_pull\(\s*(?:task_ids\s*=\s*)?['"]([^'"]+)['"]""")
_PULLED_INDEX = re.compile(r"""map_indexes\s*=\s*(\d+)""")


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
    (no source task) or is empty (a ``ray_conn_id`` names the cluster). ``source_task_id`` is what the consumer
    read from its own ``cluster`` argument; a mapped consumer's definition in the DAG file is read as well."""
    source_task_id = declared_source(consumer, source_task_id)
    if source_task_id is None or not cluster:
        return dict(cluster) if isinstance(cluster, Mapping) else None
    if not isinstance(cluster, Mapping):
        raise UserInputError("cluster", cluster, "pass the cluster-start task's XCom (a dict)")
    found = source_of(consumer, source_task_id, context, _pulled_index(consumer))
    if found is None:
        raise UserInputError(
            "cluster",
            source_task_id,
            "a Ray operator's cluster must be the XCom of a tpuflow cluster-start task (its addresses and token "
            "are derived from that task's own arguments); name other clusters with ray_conn_id",
        )
    producer, producer_context = found
    trusted = producer.cluster_from_reference(cluster, producer_context)
    moved = sorted(k for k in ADDRESS_KEYS if k in cluster and cluster[k] != trusted.get(k))
    if moved:
        consumer.log.warning(
            "The XCom of task %s names %s other than the cluster's now (%s for %s); using the cluster's own "
            "(its head was replaced, or the XCom was rewritten)",
            source_task_id,
            ", ".join(moved),
            _shown(trusted.get(moved[0])),
            _shown(cluster[moved[0]]),
        )
    changed = sorted(k for k in CREDENTIAL_KEYS if k in cluster and cluster[k] != trusted.get(k))
    if changed:
        raise ClusterTampered(
            f"cluster[{changed[0]!r}]",
            _shown(cluster[changed[0]]),
            f"the XCom of task {source_task_id} no longer matches the cluster that task made "
            f"({', '.join(changed)} changed after it was written); clear {source_task_id} to start it again",
        )
    return trusted


def declared_source(consumer: BaseOperator, captured: str | None) -> str | None:
    """The task whose XCom ``consumer``'s cluster is: what its ``cluster`` argument said when it was created
    (``captured``), else, for a mapped task, what its definition in the DAG file expands or partials it over
    (Airflow creates the unmapped task with the XCom already resolved)."""
    from airflow.sdk.definitions.xcom_arg import XComArg

    if captured is not None:
        return captured
    defined = _defined(consumer, consumer.task_id)
    if defined is None or not defined.is_mapped:
        return None
    partial = getattr(defined, "partial_kwargs", {}).get("cluster")
    value = getattr(getattr(defined, "expand_input", None), "value", None)
    if isinstance(value, Mapping):  # expand(cluster=...)
        return cluster_source_task(value.get("cluster", partial))
    # expand_kwargs(...): the task whose XCom it reads (Airflow walks lists and dicts for them), else the partial's
    references = sorted({op.task_id for op, _ in XComArg.iter_xcom_references(value)})
    return references[0] if references else cluster_source_task(partial)


def source_of(
    consumer: BaseOperator, task_id: str, context: Context, pulled_index: int | None = None
) -> tuple[ClusterSource, Context] | None:
    """The start task ``task_id`` as its DAG file defines it, unmapped for the instance whose XCom ``consumer``
    reads, and the context that instance ran in (its task id and map index); None when it is not ours."""
    defined = _defined(consumer, task_id)
    if defined is None:
        return None
    mapped = defined.is_mapped or defined.get_closest_mapped_task_group() is not None
    index = -1
    if mapped:
        own = getattr(context["ti"], "map_index", None)
        index = pulled_index if pulled_index is not None else (-1 if own is None else int(own))
        if index < 0:
            raise UserInputError(
                "cluster",
                task_id,
                f"{task_id} is mapped: it starts one cluster per map index; expand this task over its XCom "
                f"(.expand(cluster={task_id}.output)) or put both in one mapped TaskGroup",
            )
    view = _TaskInstanceView(context["ti"], task_id, index)
    producer_context = cast("Context", {**context, "ti": view, "task_instance": view})
    if defined.is_mapped:
        kwargs, _ = defined._expand_mapped_kwargs(producer_context)  # Airflow's own unmapping, for that index
        defined = defined.unmap(kwargs)
    return (defined, producer_context) if isinstance(defined, ClusterSource) else None


class _TaskInstanceView:
    """The consumer's running task instance seen as another task instance of the same run: its task id and map
    index, everything else (dag, run, XCom reads) the running one's."""

    def __init__(self, ti: Any, task_id: str, map_index: int) -> None:
        self._ti = ti
        self.task_id = task_id
        self.map_index = map_index

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ti, name)


def _defined(consumer: BaseOperator, task_id: str) -> Any:
    dag = consumer.get_dag()
    return dag.task_dict.get(task_id) if dag is not None else None


def _pulled_index(consumer: BaseOperator) -> int | None:
    """The map index a ``cluster`` template in the DAG file pulls explicitly (``xcom_pull(..., map_indexes=2)``)."""
    defined = _defined(consumer, consumer.task_id)
    raw = (
        defined.partial_kwargs.get("cluster")
        if getattr(defined, "is_mapped", False)
        else getattr(defined, "cluster", None)
    )
    found = _PULLED_INDEX.search(raw) if isinstance(raw, str) else None
    return int(found.group(1)) if found else None


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
    found = source_of(consumer, source_task_id, context)
    if found is None:
        raise UserInputError(
            "url",
            url,
            f"a bearer token is only sent to an endpoint a tpuflow deploy task made; {source_task_id} is not one "
            "(write the URL in the DAG, or take it from the deploy task's XCom)",
        )
    producer, producer_context = found
    index = producer_context["ti"].map_index
    if index is not None and index >= 0:
        reference = context["ti"].xcom_pull(task_ids=source_task_id, map_indexes=index)
    else:
        reference = context["ti"].xcom_pull(task_ids=source_task_id)
    trusted = producer.cluster_from_reference(reference if isinstance(reference, Mapping) else {}, producer_context)
    base = str(trusted.get("serve_url") or "").rstrip("/")
    if not base or not (url == base or url.startswith(f"{base}/")):
        raise ClusterTampered(
            "url",
            url,
            f"task {source_task_id} serves at {base or 'no URL'}; its XCom was changed after it was written: clear "
            f"{source_task_id} to deploy again",
        )
