"""The train-and-serve pipeline on GKE: a TPU slice node pool, KubeRay RayClusters on it, and a RayService.

A shape that keeps the slice busy: the TPU node pool is created while prep runs on CPU (a head-only
RayCluster), the TPU RayCluster joins once the pool is ready, and the training slice is deleted as
soon as training has produced its checkpoint; evaluation runs on the CPU cluster, serving on its own
slice::

    check_params -> budget_guard -> approve_budget -> create_prep_cluster (setup, CPU) -> prep ----------------------+
                                                   -> create_node_pool (setup) -> request_capacity -> create_ray_cluster -> train
                                                                                                   -> wait_for_flex_start -+
      train -> delete_ray_cluster -> delete_provisioning_request -> delete_node_pool   (at once, always)
      train -> evaluate (CPU) -> [build_serve_config, create_serve_node_pool (setup)] -> request_serve_capacity
        -> deploy (RayService) -> smoke_test -> write_report -> serve_until_idle
        -> delete_service -> delete_serve_provisioning_request -> delete_serve_node_pool
                                  (kept when keep_endpoint and the endpoint answered: labelled tpuflow-kept,
                                   which the orphan reaper honours; with idle_timeout, serve_until_idle waits
                                   in the triggerer until Serve is idle that long, and then they delete)
        -> delete_prep_cluster                        (always)
      every delete -> chip_ledger  (chips x (delete - create) per slice from the GKE operations; report.json)

Capacity (Variable ``tpuflow_tpu_capacity``, with fallbacks): a ``queued`` pool gets its nodes from a
ProvisioningRequest (request_capacity / request_serve_capacity wait until it is Provisioned; the
TPU pods consume it by annotation; Param ``max_run_duration_seconds``); a ``flex-start`` pool is grown
by GKE's autoscaler for the pending TPU pods (wait_for_flex_start reports the wait and GKE's reason).
Both capacity tasks do nothing when the pools got another capacity (e.g. after a fallback).

The chip-hour budget (Param ``max_chip_hours``) is checked before anything is provisioned
(budget_guard, against the previous run's ledger) and holds training to it (the job is stopped and
the task fails when the ledger would cross it; tpuflow.cost.training).

prep, train, evaluate, the Serve config, the smoke test and the report are the factory's shared steps
(tpuflow.pipeline.factory); only the cluster lifecycle is GKE + KubeRay. Serving gets its own
single-host slice of the training generation (Param ``serve_topology``; default the smallest one), so
the endpoint can outlive the training slice.

Every delete is a teardown whose setups include ``check_params``: it runs once the run has got past
validation, whatever failed later, including the create task it cleans up after (a teardown whose
only setup failed would be skipped by Airflow, and a RayCluster that never became ready would keep
its node pool). Names are deterministic per task instance, so a delete finds what its create made
even when the create failed before pushing XCom.

Where it runs is configuration: `variable_settings()` reads connection ids, project, cluster, image,
the workloads URI and the output root from Airflow Variables (also settable as ``AIRFLOW_VAR_<NAME>``)
when the tasks run; the project defaults to the GCP connection's own.
Pointing the DAG at the GKE and Kubernetes stand-ins is therefore a matter of connections and
Variables. Cheap to import: no google-cloud, kubernetes or ray imports at module level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow.sdk import DAG, Param

from tpuflow import paths
from tpuflow.capacity.operators import (
    GKECreateProvisioningRequestOperator,
    GKEDeleteProvisioningRequestOperator,
    GKEWaitForFlexStartCapacityOperator,
)
from tpuflow.cost.approval import BudgetGate
from tpuflow.cost.ledger import LEDGER_TASK_ID, PRICES_VARIABLE
from tpuflow.cost.operators import GKEWriteChipLedgerOperator
from tpuflow.cost.training import ChipHourBudget
from tpuflow.deprecations import warn_replaced
from tpuflow.errors import UserInputError
from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator
from tpuflow.kuberay.operators import (
    KubeRayCreateClusterOperator,
    KubeRayDeleteClusterOperator,
    KubeRayDeleteServiceOperator,
    KubeRayDeployServiceOperator,
)
from tpuflow.kuberay.ray_auth import with_cluster_auth
from tpuflow.labels import DEFAULT_EXPIRES_AFTER
from tpuflow.pipeline.factory import (
    ENDPOINT_VERDICT,
    SERVE_SLICE,
    TRAIN_SLICE,
    admission_steps,
    build_serve_config,
    checked_slice,
    keep_endpoint,
    pipeline_dag,
    run_dir_for,
    serve_until_idle_task,
    serving_expires_after,
    smoke_test_and_report,
    training_steps,
)
from tpuflow.pipeline.params import (
    MAX_RUN_DURATION_PARAM,
    START_DATE,
    ZONE_FAILOVER_PARAM,
    ZONES_PARAM,
    max_run_duration_param,
    pipeline_params,
    validate_params,
    zone_failover_param,
    zones_param,
)
from tpuflow.pipeline.steps import CheckParamsOperator
from tpuflow.work_spans import PREFLIGHT, SERVING, TRAINING

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context

    from tpuflow.pipeline.workload import Workload
    from tpuflow.tpu import TpuSlice

# Where the Ray image keeps workloads/ (the Serve app's working_dir; Ray *jobs* upload workloads/ themselves).
IMAGE_WORKLOADS_URI = "local:///home/ray/workloads"
DEFAULT_RAY_IMAGE = "rayproject/ray:2.60.0-py311"


# --- Params ------------------------------------------------------------------------------------------
def gke_pipeline_params(workload: Workload | None = None) -> dict[str, Param]:
    """The shared Params (serve_topology included: tpuflow.pipeline.params), queued capacity's
    max_run_duration_seconds, and the zones to try (zones, zone_failover); with ``workload``, less the Params of
    the steps it does not have (tpuflow.pipeline.params.STEP_PARAMS; pipeline_dag leaves them out too)."""
    return {
        **pipeline_params(workload=workload),
        MAX_RUN_DURATION_PARAM: max_run_duration_param(),
        ZONES_PARAM: zones_param(),
        ZONE_FAILOVER_PARAM: zone_failover_param(),
    }


def _or_param(param: str, value: str | None) -> str:
    """A template: the Param's value when the run sets one, else ``value`` rendered as it is (a literal, a
    template, or text with several templates in it)."""
    if not value:
        return "{{ params." + param + " or '' }}"
    return "{% if params." + param + " %}{{ params." + param + " }}{% else %}" + value + "{% endif %}"


def serve_slice(accelerator: str, topology: str | None) -> TpuSlice:
    """The endpoint's slice, of the training generation, valid on GKE and in Ray; empty: the smallest
    single-host one. A multi-host slice serves one model from all its hosts (its replica reserves the
    whole slice: accelerator_config.topology in the Serve config)."""
    from tpuflow.tpu import TpuSlice, resolve_generation

    generation = resolve_generation(accelerator)
    if not topology:
        shapes = [TpuSlice.from_spec(generation.name, t) for t in generation.gke_topologies & generation.ray_topologies]
        topology = min((s for s in shapes if not s.multi_host), key=lambda s: (s.chips, s.topology)).topology
    try:
        return TpuSlice.from_spec(generation.name, topology).require(gke=True, ray=True)
    except UserInputError as err:
        raise UserInputError("params.serve_topology", topology, err.fix) from None


class CheckGkeParamsOperator(CheckParamsOperator):
    """Check the run's Params: the training slice (as the local pipeline checks it, plus GKE's shapes)
    and the serve slice; returns both slices (``serve`` holds the serve slice). With a project, the
    project's TPU quota must hold the slices (tpuflow.gke.quota), for at least one capacity the pools
    may fall back to.

    :param project_id: the GKE cluster's project; templated; empty: quota not checked.
    :param location: the cluster's zone or region; templated.
    :param node_zone: the slices' zone (or zones, tried in order) when ``location`` is a region; templated.
    :param capacity: ``fallback_capacity``: the node pools' capacities (GKECreateTPUNodePoolOperator); templated.

    Takes CheckParamsOperator's arguments (BaseOperator's: ``task_id`` and the like).
    """

    template_fields: Sequence[str] = (
        *CheckParamsOperator.template_fields,
        "project_id",
        "location",
        "node_zone",
        "capacity",
        "fallback_capacity",
    )

    def __init__(
        self,
        *,
        project_id: str = "",
        location: str = "",
        node_zone: str = "",
        capacity: str = "on-demand",
        fallback_capacity: Any = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.location = location
        self.node_zone = node_zone
        self.capacity = capacity
        self.fallback_capacity = fallback_capacity

    def check(self, params: dict[str, Any]) -> dict[str, Any]:
        return check_gke_params(params)

    def execute(self, context: Context) -> dict[str, Any]:
        from tpuflow.gke.nodepool_spec import check_zones

        checked = super().execute(context)
        if self.location:
            try:  # the zones a run names (Param zones, else the builder's node_zone), before anything is made
                check_zones(self.location, self.node_zone)
            except UserInputError as err:
                field = f"params.{ZONES_PARAM}" if context["params"].get(ZONES_PARAM) else err.field
                raise UserInputError(field, err.value, err.fix) from None
        if self.project_id:
            self._check_quota(checked)
        return checked

    def _check_quota(self, checked: dict[str, Any]) -> None:
        from google.api_core.exceptions import GoogleAPIError

        from tpuflow.gke.hooks import CloudQuotasHook
        from tpuflow.gke.nodepool_spec import parse_capacity_order
        from tpuflow.gke.quota import check_tpu_quota, run_quota_needs
        from tpuflow.gke.workload_policy import region_of

        capacities = parse_capacity_order(self.capacity, self.fallback_capacity)
        hook = CloudQuotasHook(gcp_conn_id=self.gcp_conn_id)

        def info(quota_id: str) -> Any:
            try:
                return hook.get_quota_info(project_id=self.project_id, quota_id=quota_id)
            except GoogleAPIError as err:  # no permission to read quotas: GKE still enforces them
                self.log.warning("Could not read quota %s: %s", quota_id, str(err).splitlines()[0])
                return None

        check_tpu_quota(
            info,
            region=region_of(self.location),  # a zone's region, or the regional cluster's
            needs=run_quota_needs(checked, checked.get("serve")),
            capacities=capacities,
            say=self.log.info,
        )


def check_gke_params(params: dict[str, Any]) -> dict[str, Any]:
    from tpuflow.capacity.provisioning_request import check_max_run_duration
    from tpuflow.tpu import TpuSlice

    train = validate_params(params, local_serve=False)
    try:
        check_max_run_duration(params.get(MAX_RUN_DURATION_PARAM))
    except UserInputError as err:
        raise UserInputError(f"params.{MAX_RUN_DURATION_PARAM}", err.value, err.fix) from None
    try:
        TpuSlice.from_spec(params["accelerator"], params["topology"], params.get("machine_type") or None).require(
            gke=True
        )
    except UserInputError as err:
        raise UserInputError(f"params.{err.field}", err.value, err.fix) from None
    return {**train, "serve": serve_slice(params["accelerator"], params.get("serve_topology")).to_dict()}


# --- queued capacity: the Ray pods consume the ProvisioningRequest ------------------------------------
_REQUESTED = "{{ (ti.xcom_pull(task_ids='%s') or {}).get('name') or '' }}"
# A slice pool's GKE maxRunDuration: the budget guard's bound for its role (the budget spent on it alone, the
# dagrun_timeout, plus a margin), at most the pool's expiry (the create operators' default expires_after, 24 h: a
# budget is always set now, the admin's ceiling when the run gives none, and must not outlast what it once was).
_EXPIRY_S = int(DEFAULT_EXPIRES_AFTER.total_seconds())
_MAX_RUN_EXPR = (
    "[((ti.xcom_pull(task_ids='budget_guard') or {}).get('max_run_seconds') or {}).get('%s') or "
    + f"{_EXPIRY_S}, {_EXPIRY_S}] | min"
)
_MAX_RUN = "{{ " + _MAX_RUN_EXPR + " }}"


# --- configuration ------------------------------------------------------------------------------------
def _var(name: str, default: str) -> str:
    return "{{ var.value.get(" + repr(name) + ", " + repr(default) + ") }}"


def variable_settings() -> dict[str, Any]:
    """Builder arguments read from Airflow Variables when a task runs (no DB access at parse time).

    tpuflow_gcp_conn_id          google_cloud_default   GKE API (node pools); reaches the cluster when no
                                                        Kubernetes connection is named
    tpuflow_kubernetes_conn_id   (empty)                a ``kubernetes`` connection to the cluster instead
    tpuflow_gke_project          (empty)                empty: the GCP connection's ``project`` extra
    tpuflow_gke_location         us-east5-b             the cluster's zone or region
    tpuflow_gke_node_zone        (empty)                the slices' zone when the location is a region, or
                                                        several (comma-separated) tried in order; Param
                                                        ``zones`` overrides it per run
    tpuflow_gke_cluster          tpuflow
    tpuflow_kuberay_namespace    (empty)                empty: the connection's namespace, else default
    tpuflow_ray_image            rayproject/ray:2.60.0-py311   must carry workloads/ at the URI below
    tpuflow_serve_workloads_uri  local:///home/ray/workloads   the Serve app's working_dir on the cluster
    tpuflow_tpu_capacity         on-demand              on-demand | spot | reservation:NAME | flex-start | queued
    tpuflow_tpu_fallback_capacity (empty)               comma-separated capacities to try on a stockout
    tpuflow_gke_output_root      tpuflow.paths.output_root() when parsed ($TPUFLOW_OUTPUT_ROOT, else
                                                        outputs/ under $TPUFLOW_HOME or ~/.tpuflow)
                                                        data, checkpoints and logs: gs://BUCKET/PREFIX on GKE,
                                                        where the TPU hosts and Airflow both reach it
    """
    gcp = _var("tpuflow_gcp_conn_id", "google_cloud_default")
    gcp_expr = "var.value.get('tpuflow_gcp_conn_id', 'google_cloud_default')"
    project = (
        "{{ var.value.get('tpuflow_gke_project', '') or "
        f"(conn.get({gcp_expr}).extra_dejson if conn.get({gcp_expr}) else {{}}).get('project', '') }}}}"
    )
    return {
        "gcp_conn_id": gcp,
        "kubernetes_conn_id": _var("tpuflow_kubernetes_conn_id", ""),
        "project_id": project,
        "location": _var("tpuflow_gke_location", "us-east5-b"),
        "node_zone": _var("tpuflow_gke_node_zone", ""),
        "cluster_name": _var("tpuflow_gke_cluster", "tpuflow"),
        "namespace": _var("tpuflow_kuberay_namespace", ""),
        "image": _var("tpuflow_ray_image", DEFAULT_RAY_IMAGE),
        "serve_workloads_uri": _var("tpuflow_serve_workloads_uri", IMAGE_WORKLOADS_URI),
        "capacity": _var("tpuflow_tpu_capacity", "on-demand"),
        "fallback_capacity": _var("tpuflow_tpu_fallback_capacity", ""),
        "output_root": _var("tpuflow_gke_output_root", paths.output_root()),
    }


# --- the CPU cluster -----------------------------------------------------------------------------------
PREP_CLUSTER_CPUS = "2"


def prep_cluster_manifest(image: str, env: Mapping[str, str] | None = None, ray_auth: str = "token") -> dict[str, Any]:
    """A head-only RayCluster for the CPU steps (prep, evaluate): Ray tasks run on its head; token
    authentication on unless ``ray_auth`` opts out by name (tpuflow.kuberay.ray_auth)."""

    container: dict[str, Any] = {
        "name": "ray-head",
        "image": image,
        "ports": [
            {"containerPort": 6379, "name": "gcs"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
            {"containerPort": 8000, "name": "serve"},
        ],
        "resources": {
            "requests": {"cpu": PREP_CLUSTER_CPUS, "memory": "8Gi"},
            "limits": {"cpu": PREP_CLUSTER_CPUS, "memory": "8Gi"},
        },
    }
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec = {
        "rayVersion": "2.60.0",
        "enableInTreeAutoscaling": False,
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": PREP_CLUSTER_CPUS, "dashboard-host": "0.0.0.0"},
            "template": {"spec": {"containers": [container]}},
        },
        "workerGroupSpecs": [],
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        # no name: the create task names it per task instance, so its delete (and a retry) finds it
        "metadata": {},
        "spec": with_cluster_auth(spec, ray_auth)[0],
    }


# --- the DAG ------------------------------------------------------------------------------------------
def build_gke_pipeline_dag(
    dag_id: str,
    *,
    workload: Workload,
    gcp_conn_id: str = "google_cloud_default",
    kubernetes_conn_id: str | None = None,
    project_id: str,
    location: str,
    cluster_name: str,
    image: str,
    node_zone: str | None = None,
    namespace: str | None = None,
    capacity: str = "on-demand",
    fallback_capacity: Sequence[str] | str = (),
    serve_workloads_uri: str = IMAGE_WORKLOADS_URI,
    serve_token_conn_id: str | None = None,
    serve_code_uri: str | None = None,
    address_mode: str = "auto",
    output_root: str | None = None,
    lease_root: str | None = None,
    cluster_ready_timeout: float = 1800.0,
    service_ready_timeout: float = 1800.0,
    delete_timeout: float = 1200.0,
    poll_interval: float = 10.0,
    node_pool_poll_interval: float = 10.0,
    deferrable: bool = True,
    ray_env: Mapping[str, str] | None = None,
    ray_auth: str = "token",
    schedule: str | None = "@daily",
    start_date: datetime = START_DATE,
    max_active_runs: int = 1,
    **dag_kwargs: Any,
) -> DAG:
    """The pipeline on a GKE cluster with the Ray operator (KubeRay) add-on; see the module docstring.

    :param dag_id: the DAG's id.
    :param workload: the steps to run (tpuflow.pipeline.workload.Workload); each step it lacks has no task
        (no prep and no evaluate: no CPU RayCluster either; no serve_app: no serve slice).
    :param gcp_conn_id: Google Cloud connection for the GKE API (node pools), and for the cluster when
        no ``kubernetes_conn_id`` is given.
    :param kubernetes_conn_id: a ``kubernetes`` connection to the cluster; empty/None: reach it through
        ``gcp_conn_id`` (GKE endpoint and credentials from the google provider).
    :param project_id: the cluster's Google Cloud project.
    :param location: the cluster's zone or region.
    :param cluster_name: the GKE cluster.
    :param image: the Ray image of both clusters (must carry workloads/ at ``serve_workloads_uri``).
    :param node_zone: the slices' zone when ``location`` is a region.
    :param namespace: Kubernetes namespace of the RayCluster and RayService (default: the connection's).
    :param capacity: capacity of both node pools (see GKECreateTPUNodePoolOperator).
    :param fallback_capacity: capacities to try on a stockout, in order.
    :param serve_workloads_uri: the Serve application's runtime_env working_dir as the Ray cluster sees
        it (the image's copy of workloads/; a local:// path to the repo's workloads/ for the stand-in).
    :param serve_code_uri: the workload's code_dir as the RayService's replicas fetch it (a ``py_modules``
        entry: a gs:// zip, or local:// plus its path in the Ray image); required when the workload has both code_dir
        and serve_app (a RayService cannot upload a folder of the Airflow machine).
    :param serve_token_conn_id: an Airflow Connection whose password is the endpoint's bearer token (the
        app requires it, the smoke test sends it); None: the endpoint answers without one.
    :param address_mode: how Airflow reaches the Ray head (see the KubeRay operators).
    :param output_root: data, checkpoints and logs (default: tpuflow.paths.output_root() when parsed).
    :param lease_root: the slice leases (at most the Variable ``tpuflow_max_slices`` slices at once, across every
        run and DAG sharing it) and run supervision records; default ``OUTPUT_ROOT/_tpuflow/slice-leases``
        (tpuflow.paths.gke_lease_root), which every worker and `tpuflow reap` reach.
    :param cluster_ready_timeout: seconds for the RayCluster to become ready; past it the task fails with
        KubeRay's reason, pod states and events, and the teardowns still run.
    :param service_ready_timeout: seconds for the RayService to serve, likewise.
    :param delete_timeout: seconds for each KubeRay delete to finish.
    :param poll_interval: seconds between looks at the KubeRay objects.
    :param node_pool_poll_interval: seconds between looks at GKE operations (and the first backoff).
    :param deferrable: wait in the triggerer rather than in worker slots.
    :param ray_env: environment for the Ray head and TPU hosts of both clusters.
    :param ray_auth: Ray token authentication of every RayCluster and RayService the DAG applies (the CPU
        prep cluster too): ``"token"`` (default), or opt out by name with ``"disabled"`` / ``"none"``.
    :param schedule: the DAG's schedule.
    :param start_date: the DAG's start date.
    :param max_active_runs: runs at once (each holds TPU slices).
    :param dag_kwargs: further DAG arguments.
    """
    if workload.serve_app and workload.code_dir and not serve_code_uri:
        raise UserInputError(
            "serve_code_uri",
            serve_code_uri,
            f"give where the RayService fetches workload.code_dir {workload.code_dir} (a gs://BUCKET/code.zip of it, "
            "or local:// plus the path of its copy in the Ray image)",
        )
    run_dir = run_dir_for(dag_id, output_root)
    lease_root = lease_root or paths.gke_lease_root(output_root or paths.output_root())
    node_zone = _or_param(ZONES_PARAM, node_zone)  # the run's Param zones, else the builder's
    args = _task_arguments(
        run_dir,
        gcp_conn_id=gcp_conn_id,
        kubernetes_conn_id=kubernetes_conn_id,
        gke={"project_id": project_id, "location": location, "cluster_name": cluster_name},
        image=image,
        node_zone=node_zone,
        namespace=namespace,
        capacity=capacity,
        fallback_capacity=fallback_capacity,
        address_mode=address_mode,
        cluster_ready_timeout=cluster_ready_timeout,
        delete_timeout=delete_timeout,
        poll_interval=poll_interval,
        node_pool_poll_interval=node_pool_poll_interval,
        deferrable=deferrable,
        ray_env=ray_env,
        ray_auth=ray_auth,
    )
    # the tasks that read the cluster's project and location through the GKE connection
    located: dict[str, Any] = {"gcp_conn_id": gcp_conn_id, "project_id": project_id, "location": location}
    dag_kwargs.setdefault("doc_md", __doc__)
    with pipeline_dag(
        dag_id,
        schedule=schedule,
        start_date=start_date,
        max_active_runs=max_active_runs,
        params=gke_pipeline_params(),
        workload=workload,
        **dag_kwargs,
    ) as dag:
        checked = CheckGkeParamsOperator(
            task_id="check_params",
            output_dir=run_dir,
            node_zone=node_zone,
            capacity=capacity,
            fallback_capacity=fallback_capacity,
            workload=workload,
            **located,
        )
        serving = workload.serve_app is not None
        # One lease per run, as locally: nothing is created before it (a run waiting for a slice bills nothing).
        admission = admission_steps(
            checked,
            dag_id=dag_id,
            output_root=output_root,
            run_dir=run_dir,
            budget_slices=[
                {"role": "train", "tpu": TRAIN_SLICE, "steps": "{{ params.train_steps }}"},
                *([{"role": "serve", "tpu": SERVE_SLICE}] if serving else []),
            ],
            lease_root=lease_root,
            gcp_conn_id=gcp_conn_id,
        )
        # The CPU cluster runs prep and evaluate: a workload with neither gets none.
        create_prep, delete_prep = _prep_cluster(checked, workload, args, image, ray_env, ray_auth)
        slice_ = _training_slice(checked, args)
        cpu_cluster = create_prep.output if create_prep else None
        # the work each slice was held for (the ledger's timeline): evaluation and prep run on the CPU cluster;
        # a team's own Ray jobs on the training cluster (tpuflow.pipeline.handles) are work too
        train_ledger = [
            {
                "role": "train",
                "tpu": TRAIN_SLICE,
                "task_id": "create_node_pool",
                "work": {"preflight": PREFLIGHT, "train": TRAINING},
                "cluster_task_id": "create_ray_cluster",
            }
        ]
        prep, train, evaluate = training_steps(
            cpu_cluster,
            run_dir,
            workload=workload,
            train_cluster=slice_.create_cluster.output,
            gcp_conn_id=gcp_conn_id,
            budget=ChipHourBudget(max_chip_hours="{{ params.max_chip_hours }}", ledger_slices=train_ledger, **located),
        )
        serve_tasks = (
            _serve_steps(
                workload,
                checked,
                cluster=cpu_cluster,
                trained=train,
                after=evaluate or train,
                workloads_uri=serve_workloads_uri,
                code_uri=serve_code_uri,
                args=args,
                wait_timeout=service_ready_timeout,
                serve_token_conn_id=serve_token_conn_id,
            )
            if serving
            else None
        )
        deploy = serve_tasks[0] if serve_tasks else None
        _, report = smoke_test_and_report(
            run_dir, evaluate, deploy, workload=workload, train=train, serve_token_conn_id=serve_token_conn_id
        )
        serve_ledger = (
            [{"role": "serve", "tpu": SERVE_SLICE, "task_id": "create_serve_node_pool", "work": {"deploy": SERVING}}]
            if serving
            else []
        )
        ledger = GKEWriteChipLedgerOperator(
            task_id=LEDGER_TASK_ID,
            slices=[*train_ledger, *serve_ledger],
            trained="{{ ti.xcom_pull(task_ids='train') }}",
            output_dir=run_dir,
            prices=_var(PRICES_VARIABLE, ""),
            cluster_name=cluster_name,
            endpoint=ENDPOINT_VERDICT if serving else None,
            **located,
        )

        admission.lease >> [t for t in (create_prep, slice_.create_pool) if t]
        if create_prep and prep:
            create_prep >> prep
        [slice_.create_cluster, slice_.wait_flex, *([prep] if prep else [])] >> train
        # the training slice goes as soon as training is over; evaluation and serving do not need it
        train >> slice_.delete_cluster
        watch = serve_until_idle_task(workload, "{{ ti.xcom_pull(task_ids='deploy') }}") if serve_tasks else None
        if watch and serve_tasks:
            watch >> serve_tasks[1]  # report >> watch below
        report_next = [t for t in (watch, delete_prep) if t]
        report >> (report_next or [ledger])
        delete_serve_pool = serve_tasks[2] if serve_tasks else None
        [t for t in (slice_.delete_pool, delete_serve_pool, delete_prep) if t] >> ledger
        [t for t in (slice_.delete_pool, delete_serve_pool) if t] >> admission.release
        # check_params is a setup of every teardown: once validation passed, each delete runs whatever failed.
        checked.as_setup()  # type: ignore[no-untyped-call]  # Airflow's AbstractOperator.as_setup is unannotated
        ledger.as_teardown(setups=[checked])
    return dag


class _TaskArguments(NamedTuple):
    """The arguments the GKE DAG's task families share."""

    pools: dict[str, Any]  # the node pool creates and deletes
    creates: dict[str, Any]  # the node pool creates
    kube: dict[str, Any]  # every task that talks to the cluster's Kubernetes API
    rays: dict[str, Any]  # the RayCluster and RayService applies
    queued: dict[str, Any]  # the ProvisioningRequests and flex-start's wait
    deletes: dict[str, Any]  # the KubeRay deletes
    cluster_ready_timeout: float  # seconds for a RayCluster to become ready


def _task_arguments(
    run_dir: str,
    *,
    gcp_conn_id: str,
    kubernetes_conn_id: str | None,
    gke: dict[str, str],
    image: str,
    node_zone: str | None,
    namespace: str | None,
    capacity: str,
    fallback_capacity: Sequence[str] | str,
    address_mode: str,
    cluster_ready_timeout: float,
    delete_timeout: float,
    poll_interval: float,
    node_pool_poll_interval: float,
    deferrable: bool,
    ray_env: Mapping[str, str] | None,
    ray_auth: str,
) -> _TaskArguments:
    """build_gke_pipeline_dag's arguments, as each task family takes them."""
    pools: dict[str, Any] = {
        **gke,
        "gcp_conn_id": gcp_conn_id,
        "deferrable": deferrable,
        "poll_interval": node_pool_poll_interval,
        "retry_backoff": node_pool_poll_interval,
    }
    creates: dict[str, Any] = {
        **pools,
        "capacity": capacity,
        "fallback_capacity": fallback_capacity,
        "node_zone": node_zone,
        "zone_failover": "{{ params." + ZONE_FAILOVER_PARAM + " }}",
        # over budget: a slice is asked for only once an approver's answer is recorded for the run
        "pre_execute": BudgetGate(record_dir=run_dir, gcp_conn_id=gcp_conn_id),
    }
    kube: dict[str, Any] = {
        "kubernetes_conn_id": kubernetes_conn_id,
        "gke_cluster": gke,
        "gcp_conn_id": gcp_conn_id,
        "namespace": namespace,
        "deferrable": deferrable,
        "poll_interval": poll_interval,
    }
    # The RayCluster and the RayService: a cluster that missed its deadline would miss it again (no
    # retries); the teardowns release the slice.
    rays: dict[str, Any] = {
        **kube,
        "image": image,
        "env": dict(ray_env or {}),
        "ray_auth": ray_auth,
        "address_mode": address_mode,
        "retries": 0,
    }
    # queued pools: ask for their nodes (nothing to do for other capacities, fallbacks included)
    queued: dict[str, Any] = {
        **kube,
        "max_run_duration_seconds": "{{ params.max_run_duration_seconds or '' }}",
        "wait_timeout": cluster_ready_timeout,
        "pre_execute": creates["pre_execute"],
    }
    deletes: dict[str, Any] = {**kube, "wait_timeout": delete_timeout}
    return _TaskArguments(pools, creates, kube, rays, queued, deletes, cluster_ready_timeout)


def _prep_cluster(
    checked: BaseOperator,
    workload: Workload,
    args: _TaskArguments,
    image: str,
    ray_env: Mapping[str, str] | None,
    ray_auth: str,
) -> tuple[BaseOperator | None, BaseOperator | None]:
    """The CPU RayCluster that runs prep and evaluate, and its delete (a teardown); (None, None) when the
    workload has neither."""
    if not (workload.prep or workload.evaluate_job):
        return None, None
    create_prep = KubeRayCreateClusterOperator(
        task_id="create_prep_cluster",
        manifest=prep_cluster_manifest(image, ray_env, ray_auth),
        wait_timeout=args.cluster_ready_timeout,
        **{k: v for k, v in args.rays.items() if k not in ("image", "env")},
    )
    delete_prep = KubeRayDeleteClusterOperator(
        task_id="delete_prep_cluster", cluster_task_id="create_prep_cluster", **args.deletes
    )
    delete_prep.as_teardown(setups=[checked, create_prep])
    return create_prep, delete_prep


class _TrainingSlice(NamedTuple):
    """The training slice's tasks: its node pool, queued capacity, RayCluster, and their teardowns."""

    create_pool: BaseOperator
    request_capacity: BaseOperator
    create_cluster: BaseOperator
    wait_flex: BaseOperator
    delete_cluster: BaseOperator
    delete_request: BaseOperator
    delete_pool: BaseOperator


def _training_slice(checked: BaseOperator, args: _TaskArguments) -> _TrainingSlice:
    """The training slice, from its node pool (and, queued, its ProvisioningRequest) to the RayCluster on it,
    and the teardowns that delete them in the reverse order (each also a teardown of check_params)."""
    create_pool = GKECreateTPUNodePoolOperator(
        task_id="create_node_pool", tpu_slice=checked_slice(), max_run_duration=_MAX_RUN % "train", **args.creates
    )
    request_capacity = GKECreateProvisioningRequestOperator(
        task_id="request_capacity", node_pool_task_id="create_node_pool", tpu_slice=checked_slice(), **args.queued
    )
    create_cluster = KubeRayCreateClusterOperator(
        task_id="create_ray_cluster",
        tpu_slice=checked_slice(),
        provisioning_request_name=_REQUESTED % "request_capacity",
        wait_timeout=args.cluster_ready_timeout,
        **args.rays,
    )
    wait_flex = GKEWaitForFlexStartCapacityOperator(
        task_id="wait_for_flex_start",
        node_pool_task_id="create_node_pool",
        ray_cluster_task_id="create_ray_cluster",
        tpu_slice=checked_slice(),
        **{k: v for k, v in args.queued.items() if k != "max_run_duration_seconds"},
    )
    delete_cluster = KubeRayDeleteClusterOperator(
        task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", **args.deletes
    )
    delete_request = GKEDeleteProvisioningRequestOperator(
        task_id="delete_provisioning_request", created_by_task_id="request_capacity", **args.kube
    )
    delete_pool = GKEDeleteNodePoolOperator(
        task_id="delete_node_pool", created_by_task_id="create_node_pool", **args.pools
    )
    create_pool >> request_capacity >> [create_cluster, wait_flex]
    create_pool >> create_cluster  # (also through request_capacity; stated for readers of the graph)
    delete_cluster >> delete_request >> delete_pool
    delete_cluster >> delete_pool
    delete_pool.as_teardown(setups=[checked, create_pool])
    delete_cluster.as_teardown(setups=[checked, create_cluster])
    delete_request.as_teardown(setups=[checked, request_capacity])
    return _TrainingSlice(
        create_pool, request_capacity, create_cluster, wait_flex, delete_cluster, delete_request, delete_pool
    )


def _serve_steps(
    workload: Workload,
    checked: BaseOperator,
    *,
    cluster: Any,
    trained: BaseOperator,
    after: BaseOperator,
    workloads_uri: str,
    code_uri: str | None,
    args: _TaskArguments,
    wait_timeout: float,
    serve_token_conn_id: str | None = None,
) -> tuple[BaseOperator, BaseOperator, BaseOperator]:
    """The serve slice's node pool, its capacity request, the RayService and their teardowns (kept when
    keep_endpoint and the endpoint answered). Returns (deploy, delete_service, delete_serve_node_pool).

    ``cluster``: the CPU cluster's XCom (None without one: the config then names the backend only)."""
    serve_cfg = build_serve_config(
        cluster if cluster is not None else {"backend": "kuberay"},
        trained.output,
        workloads_uri,
        tpu_slice=SERVE_SLICE,
        workload=workload,
        code_uri=code_uri,
    )
    create_serve_pool = GKECreateTPUNodePoolOperator(
        task_id="create_serve_node_pool",
        tpu_slice=checked_slice(serve=True),
        # a kept endpoint outlives its run's other slices: its pool's GKE deadline is the admin's kept lifetime
        # (tpuflow.limits), or the budget's bound if shorter
        max_run_duration="{{ tpuflow_limits.kept_endpoint_seconds(%s) if params.keep_endpoint else (%s) }}"
        % ((_MAX_RUN_EXPR % "serve",) * 2),
        expires_after=serving_expires_after(workload),
        **args.creates,
    )
    request_serve_capacity = GKECreateProvisioningRequestOperator(
        task_id="request_serve_capacity",
        node_pool_task_id="create_serve_node_pool",
        tpu_slice=checked_slice(serve=True),
        **args.queued,
    )
    deploy = KubeRayDeployServiceOperator(
        task_id="deploy",
        serve_config=serve_cfg,
        tpu_slice=checked_slice(serve=True),
        provisioning_request_name=_REQUESTED % "request_serve_capacity",
        wait_timeout=wait_timeout,
        serve_token_conn_id=serve_token_conn_id,
        expires_after=serving_expires_after(workload),
        **args.rays,
    )
    keep = keep_endpoint(workload)
    delete_service = KubeRayDeleteServiceOperator(
        task_id="delete_service", service_task_id="deploy", keep=keep, **args.deletes
    )
    delete_serve_request = GKEDeleteProvisioningRequestOperator(
        task_id="delete_serve_provisioning_request",
        created_by_task_id="request_serve_capacity",
        keep=keep,
        **args.kube,
    )
    delete_serve_pool = GKEDeleteNodePoolOperator(
        task_id="delete_serve_node_pool", created_by_task_id="create_serve_node_pool", keep=keep, **args.pools
    )
    after >> [serve_cfg, create_serve_pool]
    create_serve_pool >> request_serve_capacity
    [serve_cfg, create_serve_pool, request_serve_capacity] >> deploy
    delete_service >> delete_serve_request >> delete_serve_pool
    delete_service >> delete_serve_pool
    delete_serve_request.as_teardown(setups=[checked, request_serve_capacity])
    delete_serve_pool.as_teardown(setups=[checked, create_serve_pool])
    delete_service.as_teardown(setups=[checked])
    return deploy, delete_service, delete_serve_pool


# --- old names, kept for one release (tpuflow.deprecations) --------------------------------------------
# The keep and queued-capacity variants are arguments of the operators they extended now: ``keep`` on the
# deletes, ``provisioning_request_name`` on the KubeRay create and deploy operators.
class QueuedCapacityRayClusterOperator(KubeRayCreateClusterOperator):
    """Deprecated: KubeRayCreateClusterOperator(provisioning_request_name=...); this name goes in the next release."""

    def __init__(self, *, provisioning_request: str | None = None, **kwargs: Any) -> None:
        warn_replaced(type(self).__name__, "KubeRayCreateClusterOperator(provisioning_request_name=...)")
        super().__init__(provisioning_request_name=provisioning_request, **kwargs)


class QueuedCapacityDeployServiceOperator(KubeRayDeployServiceOperator):
    """Deprecated: KubeRayDeployServiceOperator(provisioning_request_name=...); this name goes in the next release."""

    def __init__(self, *, provisioning_request: str | None = None, **kwargs: Any) -> None:
        warn_replaced(type(self).__name__, "KubeRayDeployServiceOperator(provisioning_request_name=...)")
        super().__init__(provisioning_request_name=provisioning_request, **kwargs)


class KeepableDeleteServiceOperator(KubeRayDeleteServiceOperator):
    """Deprecated: KubeRayDeleteServiceOperator(keep=...); this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_replaced(type(self).__name__, "KubeRayDeleteServiceOperator(keep=...)")
        super().__init__(**kwargs)


class KeepableDeleteProvisioningRequestOperator(GKEDeleteProvisioningRequestOperator):
    """Deprecated: GKEDeleteProvisioningRequestOperator(keep=...); this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_replaced(type(self).__name__, "GKEDeleteProvisioningRequestOperator(keep=...)")
        super().__init__(**kwargs)


class KeepableDeleteNodePoolOperator(GKEDeleteNodePoolOperator):
    """Deprecated: GKEDeleteNodePoolOperator(keep=...); this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_replaced(type(self).__name__, "GKEDeleteNodePoolOperator(keep=...)")
        super().__init__(**kwargs)
