"""Start and stop the embedded local Ray cluster from a DAG (the default backend).

Starting local processes is not an external wait that a trigger could watch: it takes the
seconds Ray needs to boot its nodes, and the operator does it directly. Everything after
(jobs, Serve) goes through the same dashboard APIs and deferrable triggers as on GKE.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.deprecations import warn_renamed
from tpuflow.labels import DEFAULT_EXPIRES_AFTER
from tpuflow.naming import TaskIdentity
from tpuflow.ray.cluster_source import ClusterTampered, cluster_source_task
from tpuflow.ray.links import RayDashboardLink
from tpuflow.templating import is_true
from tpuflow.tpu.slice_argument import resolve_slice
from tpuflow.validation import check_count, check_rendered_seconds, check_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.local.cluster import LocalRayCluster
    from tpuflow.tpu import TpuSlice
    from tpuflow.tpu.slice_argument import SliceArgument


def local_cluster_name(identity: TaskIdentity) -> str:
    """One cluster per instance of the start task (dag, run, task, map index), the same on every try:
    two mapped instances never share a cluster."""
    return identity.dns_name("local", identity.dag_id, max_len=48)


def _state_dir(base_dir: str | None, identity: TaskIdentity) -> Path:

    from tpuflow.local.cluster import default_base_dir

    return Path(base_dir or default_base_dir()) / local_cluster_name(identity)


class LocalRayCreateClusterOperator(ArgumentChecks, BaseOperator):
    """Start (or adopt, on a retry) a local Ray cluster simulating the requested TPU slice.

    Each simulated TPU host is its own Ray node carrying the TPU_* variables GKE injects. The
    cluster is named after the task instance, so a retry adopts it and mapped instances get one
    each. Static slice arguments are checked when the DAG file is parsed, templated ones when the
    task starts. Pushes the cluster's connection info (dashboard_url, serve_url, ...) as the
    task's return value. Killing the task while the cluster starts (mark failed/success, clear)
    stops the nodes it started: they run in their own sessions, so ending the task process alone
    would leave them running.

    :param tpu_slice: the slice to simulate (tpuflow.tpu.slice_argument): a TpuSlice
        (``TpuSlice.from_spec("v6e", "2x2")``), its ``to_dict()``, or ``{"accelerator", "topology",
        "machine_type"?, "num_slices"?}`` whose values may be templates. ``accelerator`` in any of its names
        (``v6e``, ``TPU-V6E``, ...); ``topology`` the shape, e.g. ``2x2`` or ``4x4`` (not a chip count);
        ``machine_type`` only to pick among machine types of one shape, e.g. ``ct6e-standard-4t``;
        ``num_slices`` identical slices to simulate. Templated.
    :param base_dir: where cluster state lives (default: ``clusters/`` under ``$TPUFLOW_HOME``).
    :param head_cpus: CPUs the head node offers to Ray.
    :param host_cpus: CPUs each simulated TPU host offers to Ray (default: one per TPU device of the host, so
        a placement bundle per chip places as on GKE).
    :param start_timeout: seconds to wait for every node to join.
    :param expires_after: (seconds or timedelta, or a template rendering to one) recorded in the cluster's state
        as ``expires_at``, this long after the start (default 24 hours, as a node pool's ``tpuflow-expires``
        label): past it the orphan reaper stops the cluster whatever its run's state. None: it never expires. A
        retry that adopts the cluster keeps the first. Templated.
    """

    template_fields: Sequence[str] = ("tpu_slice", "base_dir", "expires_after")
    operator_extra_links = (RayDashboardLink(),)
    ui_color = "#e0f2d9"

    def __init__(
        self,
        *,
        tpu_slice: SliceArgument,
        base_dir: str | None = None,
        head_cpus: int = 2,
        host_cpus: int | None = None,
        start_timeout: float = 300.0,
        expires_after: timedelta | float | str | None = DEFAULT_EXPIRES_AFTER,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tpu_slice = tpu_slice
        self.base_dir = base_dir
        self.head_cpus = head_cpus
        self.host_cpus = host_cpus
        self.start_timeout = start_timeout
        self.expires_after = expires_after
        self._owned: Path | None = None  # what on_kill stops: the state dir of the cluster being started

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.head_cpus,), lambda: check_count("head_cpus", self.head_cpus, minimum=1)),
            ((self.host_cpus,), lambda: self.host_cpus is None or check_count("host_cpus", self.host_cpus, minimum=1)),
            ((self.start_timeout,), lambda: check_seconds("start_timeout", self.start_timeout)),
            ((self.expires_after,), self._lifetime),
            ((self.tpu_slice,), self.resolved_slice),
        ]

    def resolved_slice(self) -> TpuSlice:
        """The slice to simulate (UserInputError naming ``tpu_slice.<key>`` when Ray cannot run it)."""

        return resolve_slice(self.tpu_slice, ray=True)

    def _lifetime(self) -> float | None:
        """Seconds the cluster may live (``expires_after``); None: no limit."""
        return check_rendered_seconds("expires_after", self.expires_after)

    def execute(self, context: Context) -> dict[str, Any]:

        from airflow.sdk.exceptions import AirflowTaskTerminated

        from tpuflow.local.cluster import LocalRayCluster

        self.validate_arguments()
        tpu = self.resolved_slice()
        lifetime = self._lifetime()
        identity = TaskIdentity.from_context(context)
        name = local_cluster_name(identity)
        self.log.info("Starting local Ray cluster %s simulating %s", name, tpu.summary())
        self._owned = state_dir = _state_dir(self.base_dir, identity)
        try:
            cluster = LocalRayCluster.start(
                tpu,
                name,
                self.base_dir,
                head_cpus=self.head_cpus,
                host_cpus=self.host_cpus,
                timeout=self.start_timeout,
                expires_at=None if lifetime is None else time.time() + lifetime,
                owner=identity.record(),
            )
        except AirflowTaskTerminated:  # raised by on_kill; start() stopped the nodes it spawned
            _stop_recorded(state_dir)  # and an adopted cluster, which start() leaves alone
            raise
        finally:
            self._owned = None
        RayDashboardLink.persist(context, url=cluster.dashboard_url)
        self.log.info(
            "Ray dashboard: %s  Serve: %s  state: %s", cluster.dashboard_url, cluster.serve_url, cluster.state_dir
        )
        return cluster.connection_info()

    def cluster_from_reference(self, reference: Mapping[str, Any], context: Context) -> dict[str, Any]:
        """The connection info of the cluster this task instance started in this run (tpuflow.ray.cluster_source):
        found by its deterministic name under this task's base dir, never at a folder the reference names."""
        identity = TaskIdentity.from_context(context, self.task_id)
        name = local_cluster_name(identity)
        if reference.get("name") not in (None, name):
            raise ClusterTampered(
                "cluster['name']",
                reference.get("name"),
                f"task {self.task_id} of this run started local cluster {name}; clear {self.task_id} to start it again",
            )
        base_dir = self.render_template(self.base_dir, context) if self.base_dir else None
        cluster = load_owned_cluster(_state_dir(base_dir, identity), identity)
        if cluster is None:
            raise ClusterTampered(
                "cluster['name']", name, f"local cluster {name} is not running; clear {self.task_id} to start it"
            )
        return cluster.connection_info()

    def on_kill(self) -> None:
        """Killed while starting the cluster: stop it.

        The task runner calls this from its SIGTERM handler, on the thread blocked in
        LocalRayCluster.start(); raising there unwinds start(), whose cleanup stops every node it
        spawned, including one not yet in the state file. From any other thread: stop what the state
        file lists.
        """

        from airflow.sdk.exceptions import AirflowTaskTerminated

        state_dir = self._owned
        if state_dir is None:
            return
        if threading.current_thread() is threading.main_thread():
            raise AirflowTaskTerminated(f"task killed while starting the local Ray cluster in {state_dir}")
        _stop_recorded(state_dir)


def _stop_recorded(state_dir: Any) -> None:
    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster, check_private_state_dir

    if (state_dir / STATE_FILE).exists():
        check_private_state_dir(state_dir)
        LocalRayCluster.load(state_dir).stop(timeout=3.0)  # SIGKILL follows SIGTERM after ~5 s


def load_owned_cluster(state_dir: Path, owner: TaskIdentity) -> LocalRayCluster | None:
    """The local cluster recorded in ``state_dir`` when its state is this user's private folder and names
    ``owner`` exactly as the task that started it (None: no state there); else ClusterTampered."""
    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster, check_private_state_dir

    if not (state_dir / STATE_FILE).exists():
        return None
    check_private_state_dir(state_dir)
    cluster = LocalRayCluster.load(state_dir)
    if TaskIdentity.from_record(cluster.owner) != owner:
        raise ClusterTampered(
            "cluster", cluster.name, f"local cluster {cluster.name} was not started by {owner.task_id} of this run"
        )
    return cluster


class LocalRayDeleteClusterOperator(BaseOperator):
    """Stop exactly the processes of the run's local cluster (never `ray stop`). A teardown task.

    :param cluster: the create task's XCom (``start.output``): it orders this task after the create task. The
        cluster stopped is always the create task's of this run, found by its deterministic name under
        ``base_dir`` (so a half-started cluster is still stopped), never a folder the XCom names.
    :param keep: leave the cluster running (e.g. to keep a Serve endpoint up), its state marked ``kept`` so
        the orphan reaper leaves it; `tpuflow local down` stops it later. True, or a string "true"/"True"/"1"
        once rendered.
    :param base_dir: where cluster state lives; the same as the create task's.
    :param create_task_id: the create task (same DAG run and map index), to find its cluster by name; by
        default the task whose XCom ``cluster`` is, else ``start_cluster``. When that task is mapped and this one
        is not, every map index's cluster is stopped.
    """

    template_fields: Sequence[str] = ("cluster", "keep", "base_dir")

    def __init__(
        self,
        *,
        cluster: dict[str, Any] | str | None = None,
        keep: bool | str = False,
        base_dir: str | None = None,
        create_task_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster
        self.keep = keep
        self.base_dir = base_dir
        self.create_task_id = create_task_id or cluster_source_task(cluster) or "start_cluster"

    def execute(self, context: Context) -> dict[str, Any] | None:
        """Stops (or keeps) the cluster; returns nothing (a subclass may return an XCom)."""
        # The cluster is the create task's of this run, found by its deterministic name under base_dir: never
        # a folder the XCom names (a user who may write XComs could point it anywhere).
        for owner in self._owners(context):
            self._stop_or_keep(owner)
        return None

    def _owners(self, context: Context) -> list[TaskIdentity]:
        """The create task's instances whose cluster this task stops: the one of its own map index, or all of
        them when the create task is mapped (or in a mapped TaskGroup) and this task is not."""
        own = TaskIdentity.from_context(context, self.create_task_id)
        dag = self.get_dag()
        create = dag.task_dict.get(self.create_task_id) if dag is not None else None
        if create is None:  # not in a DAG with it: the instance of this task's own map index
            return [own]
        if not (create.is_mapped or create.get_closest_mapped_task_group() is not None):
            return [replace(own, map_index=-1)]
        if own.map_index >= 0:
            return [own]
        from airflow.sdk.configuration import conf

        count = conf.getint("core", "max_map_length", fallback=1024)
        return [replace(own, map_index=index) for index in range(count)]

    def _stop_or_keep(self, owner: TaskIdentity) -> None:
        state_dir = _state_dir(self.base_dir, owner)
        cluster = load_owned_cluster(state_dir, owner)
        if cluster is None:
            if owner.map_index < 0:
                self.log.info(
                    "No local cluster state at %s: nothing to %s", state_dir, "keep" if is_true(self.keep) else "stop"
                )
            return
        if is_true(self.keep):
            cluster.mark_kept()  # the orphan reaper leaves it
            self.log.info(
                "keep_endpoint is set: leaving local cluster %s running (marked kept); `tpuflow local down --name %s` "
                "stops it",
                cluster.name,
                cluster.name,
            )
            return
        stopped = cluster.stop()
        self.log.info("Stopped local Ray cluster %s (%d process groups/pids signalled)", cluster.name, len(stopped))


# Old names, kept for one release (tpuflow.deprecations): each warns and is the renamed class.
class LocalRayClusterCreateOperator(LocalRayCreateClusterOperator):
    """Deprecated: renamed LocalRayCreateClusterOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("LocalRayClusterCreateOperator", LocalRayCreateClusterOperator)
        super().__init__(**kwargs)


class LocalRayClusterDeleteOperator(LocalRayDeleteClusterOperator):
    """Deprecated: renamed LocalRayDeleteClusterOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("LocalRayClusterDeleteOperator", LocalRayDeleteClusterOperator)
        super().__init__(**kwargs)
