"""Start and stop the embedded local Ray cluster from a DAG (the default backend).

Starting local processes is not an external wait that a trigger could watch: it takes the
seconds Ray needs to boot its nodes, and the operator does it directly. Everything after
(jobs, Serve) goes through the same dashboard APIs and deferrable triggers as on GKE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from tpuflow.naming import dns_name, run_key
from tpuflow.rayjob.links import RayDashboardLink

if TYPE_CHECKING:
    from airflow.sdk import Context


def local_cluster_name(dag_id: str, run_id: str, task_id: str = "") -> str:
    """One cluster per DAG run (and start task), the same on every try."""
    return dns_name("local", dag_id, key=run_key(dag_id, run_id, task_id), max_len=48)


class LocalRayClusterCreateOperator(BaseOperator):
    """Start (or adopt, on a retry) a local Ray cluster simulating the requested TPU slice.

    Pushes the cluster's connection info (dashboard_url, serve_url, ...) as the task's return value.
    Killing the task while the cluster starts (mark failed/success, clear) stops the nodes it started:
    they run in their own sessions, so ending the task process alone would leave them running.
    """

    template_fields: Sequence[str] = ("accelerator", "topology", "machine_type", "num_slices", "base_dir")
    operator_extra_links = (RayDashboardLink(),)
    ui_color = "#e0f2d9"

    def __init__(
        self,
        *,
        accelerator: str,
        topology: str,
        machine_type: str | None = None,
        num_slices: int | str = 1,
        base_dir: str | None = None,
        head_cpus: int = 2,
        host_cpus: int = 1,
        start_timeout: float = 300.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.accelerator = accelerator
        self.topology = topology
        self.machine_type = machine_type
        self.num_slices = num_slices
        self.base_dir = base_dir
        self.head_cpus = head_cpus
        self.host_cpus = host_cpus
        self.start_timeout = start_timeout

    def execute(self, context: Context) -> dict[str, Any]:
        from pathlib import Path

        from airflow.sdk.exceptions import AirflowTaskTerminated
        from tpuflow.local.cluster import DEFAULT_BASE_DIR, LocalRayCluster
        from tpuflow.tpu import TpuSlice

        tpu = TpuSlice.from_spec(self.accelerator, self.topology, self.machine_type or None, self.num_slices)
        tpu.require(ray=True)
        ti = context["ti"]
        name = local_cluster_name(ti.dag_id, ti.run_id, ti.task_id)
        self.log.info("Starting local Ray cluster %s simulating %s", name, tpu.summary())
        self._starting = state_dir = Path(self.base_dir or DEFAULT_BASE_DIR) / name
        try:
            cluster = LocalRayCluster.start(
                tpu, name, self.base_dir, head_cpus=self.head_cpus, host_cpus=self.host_cpus,
                timeout=self.start_timeout,
            )
        except AirflowTaskTerminated:  # raised by on_kill; start() stopped the nodes it spawned
            _stop_recorded(state_dir)  # and an adopted cluster, which start() leaves alone
            raise
        finally:
            self._starting = None
        RayDashboardLink.persist(context, url=cluster.dashboard_url)
        self.log.info(
            "Ray dashboard: %s  Serve: %s  state: %s", cluster.dashboard_url, cluster.serve_url, cluster.state_dir
        )
        return cluster.connection_info()

    def on_kill(self) -> None:
        """Killed while starting the cluster: stop it.

        The task runner calls this from its SIGTERM handler, on the thread blocked in
        LocalRayCluster.start(); raising there unwinds start(), whose cleanup stops every node it
        spawned, including one not yet in the state file. From any other thread: stop what the state
        file lists.
        """
        import threading

        from airflow.sdk.exceptions import AirflowTaskTerminated

        state_dir = getattr(self, "_starting", None)
        if state_dir is None:
            return
        if threading.current_thread() is threading.main_thread():
            raise AirflowTaskTerminated(f"task killed while starting the local Ray cluster in {state_dir}")
        _stop_recorded(state_dir)


def _stop_recorded(state_dir: Any) -> None:
    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster

    if (state_dir / STATE_FILE).exists():
        LocalRayCluster.load(state_dir).stop(timeout=3.0)  # SIGKILL follows SIGTERM after ~5 s


class LocalRayClusterDeleteOperator(BaseOperator):
    """Stop exactly the processes of the run's local cluster (never `ray stop`). A teardown task.

    :param cluster: the create task's XCom; when empty (the create task failed early) the cluster
        is found by its deterministic name, so a half-started cluster is still stopped.
    :param keep: leave the cluster running (e.g. to keep a Serve endpoint up); `tpuflow local down`
        stops it later.
    """

    template_fields: Sequence[str] = ("cluster", "keep", "base_dir")

    def __init__(
        self,
        *,
        cluster: dict[str, Any] | str | None = None,
        keep: bool | str = False,
        base_dir: str | None = None,
        create_task_id: str = "start_cluster",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster
        self.keep = keep
        self.base_dir = base_dir
        self.create_task_id = create_task_id

    def execute(self, context: Context) -> None:
        from pathlib import Path

        from tpuflow.local.cluster import DEFAULT_BASE_DIR, STATE_FILE, LocalRayCluster

        if self.keep in (True, "True", "true", "1"):
            self.log.info("keep_endpoint is set: leaving the cluster running; `tpuflow local down` stops it")
            return
        ti = context["ti"]
        if isinstance(self.cluster, dict) and self.cluster.get("state_dir"):
            state_dir = Path(self.cluster["state_dir"])
        else:
            name = local_cluster_name(ti.dag_id, ti.run_id, self.create_task_id)
            state_dir = Path(self.base_dir or DEFAULT_BASE_DIR) / name
        if not (state_dir / STATE_FILE).exists():
            self.log.info("No local cluster state at %s: nothing to stop", state_dir)
            return
        cluster = LocalRayCluster.load(state_dir)
        stopped = cluster.stop()
        self.log.info("Stopped local Ray cluster %s (%d process groups/pids signalled)", cluster.name, len(stopped))
