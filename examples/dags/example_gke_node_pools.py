"""Airflow DAG (example): a TPU slice node pool on GKE, on-demand with fallbacks, queued or flex-start capacity.

The how-to page docs/howto/gke-node-pools.md includes the marked parts. Parsing it contacts nothing: every
argument is checked (a bad literal fails the import) and the GKE API is only called when a task runs.
"""

from datetime import datetime

from airflow.sdk import DAG

from tpuflow.capacity.operators import (
    GKECreateProvisioningRequestOperator,
    GKEDeleteProvisioningRequestOperator,
    GKEWaitForFlexStartCapacityOperator,
)
from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator
from tpuflow.kuberay.operators import KubeRayCreateClusterOperator, KubeRayDeleteClusterOperator
from tpuflow.tpu import TpuSlice

# [START howto_gke_cluster_arguments]
SLICE = TpuSlice.from_spec("v6e", "4x4")  # 16 chips: 4 hosts of ct6e-standard-4t
GKE = dict(project_id="my-project", location="us-east5-b", cluster_name="tpuflow", gcp_conn_id="google_cloud_default")
KUBE = dict(gke_cluster={"project_id": "my-project", "location": "us-east5-b", "cluster_name": "tpuflow"})
REGIONAL = {**GKE, "location": "us-east5"}  # a regional cluster: the slice's zone is named per pool
# [END howto_gke_cluster_arguments]

with DAG("example_gke_node_pools", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    # [START howto_gke_create_tpu_node_pool]
    pool = GKECreateTPUNodePoolOperator(
        task_id="create_pool",
        tpu_slice=SLICE,
        capacity="spot",  # on-demand | spot | reservation:NAME | flex-start | queued
        fallback_capacity=["on-demand"],  # tried in order on a stockout
        node_zone=["us-east5-a", "us-east5-b"],  # zones of the regional cluster, tried in order
        zone_failover="zone-first",
        deferrable=True,
        **REGIONAL,
    )
    # [END howto_gke_create_tpu_node_pool]

    # [START howto_gke_delete_node_pool]
    delete_pool = GKEDeleteNodePoolOperator(task_id="delete_pool", created_by_task_id="create_pool", **REGIONAL)
    pool >> delete_pool.as_teardown(setups=pool)
    # [END howto_gke_delete_node_pool]

with DAG("example_gke_queued_capacity", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    # [START howto_gke_provisioning_request]
    queued_pool = GKECreateTPUNodePoolOperator(task_id="create_pool", tpu_slice=SLICE, capacity="queued", **GKE)
    request = GKECreateProvisioningRequestOperator(
        task_id="request_capacity",
        tpu_slice=SLICE,
        node_pool_task_id="create_pool",  # the pool the request's nodes join
        max_run_duration_seconds=6 * 3600,  # GKE takes the nodes back after this (default: seven days)
        wait_timeout=3600,
        **KUBE,
    )
    queued_ray = KubeRayCreateClusterOperator(
        task_id="create_ray_cluster",
        tpu_slice=SLICE,
        image="rayproject/ray:2.60.0-py311",
        provisioning_request_name="{{ ti.xcom_pull(task_ids='request_capacity')['name'] }}",  # its nodes, exactly
        **KUBE,
    )
    drop_queued_ray = KubeRayDeleteClusterOperator(
        task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", **KUBE
    )
    give_back = GKEDeleteProvisioningRequestOperator(
        task_id="delete_request",
        created_by_task_id="request_capacity",
        keep="{{ params.get('keep_endpoint', False) }}",  # true: left in place, labelled tpuflow-kept=true
        **KUBE,
    )
    delete_queued_pool = GKEDeleteNodePoolOperator(task_id="delete_pool", created_by_task_id="create_pool", **GKE)
    queued_pool >> request >> queued_ray >> drop_queued_ray.as_teardown(setups=queued_ray)
    drop_queued_ray >> give_back.as_teardown(setups=request) >> delete_queued_pool.as_teardown(setups=queued_pool)
    # [END howto_gke_provisioning_request]

with DAG("example_gke_flex_start", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    # [START howto_gke_flex_start]
    flex_pool = GKECreateTPUNodePoolOperator(task_id="create_pool", tpu_slice=SLICE, capacity="flex-start", **GKE)
    ray_cluster = KubeRayCreateClusterOperator(
        task_id="create_ray_cluster", tpu_slice=SLICE, image="rayproject/ray:2.60.0-py311", **KUBE
    )
    wait_for_nodes = GKEWaitForFlexStartCapacityOperator(
        task_id="wait_for_flex_start",
        tpu_slice=SLICE,
        node_pool_task_id="create_pool",
        ray_cluster_task_id="create_ray_cluster",  # whose pending TPU pods make the autoscaler add the slice
        wait_timeout=3600,
        **KUBE,
    )
    drop_ray = KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", **KUBE)
    drop_flex_pool = GKEDeleteNodePoolOperator(task_id="delete_pool", created_by_task_id="create_pool", **GKE)
    flex_pool >> ray_cluster >> wait_for_nodes >> drop_ray.as_teardown(setups=ray_cluster)
    drop_ray >> drop_flex_pool.as_teardown(setups=flex_pool)
    # [END howto_gke_flex_start]
