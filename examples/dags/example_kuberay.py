"""Airflow DAG (example): a KubeRay RayCluster on a TPU slice node pool, a Ray job on it, and a RayService.

The how-to page docs/howto/kuberay.md includes the marked parts. Parsing it contacts nothing.
"""

from datetime import datetime

from airflow.sdk import DAG

from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator
from tpuflow.kuberay.operators import (
    KubeRayCreateClusterOperator,
    KubeRayDeleteClusterOperator,
    KubeRayDeleteServiceOperator,
    KubeRayDeployServiceOperator,
)
from tpuflow.rayjob.operators import RaySubmitJobOperator
from tpuflow.tpu import TpuSlice

SLICE = TpuSlice.from_spec("v6e", "2x4", machine_type="ct6e-standard-4t")  # two 4-chip hosts
GKE = dict(project_id="my-project", location="us-east5-b", cluster_name="tpuflow")
KUBE = dict(gke_cluster=GKE, deferrable=True)
IMAGE = "us-east5-docker.pkg.dev/my-project/tpuflow/ray-tpu:0.1.0"

with DAG("example_kuberay_cluster", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    pool = GKECreateTPUNodePoolOperator(task_id="create_pool", tpu_slice=SLICE, **GKE)
    # [START howto_kuberay_create_cluster]
    cluster = KubeRayCreateClusterOperator(
        task_id="create_ray_cluster",
        tpu_slice=SLICE,  # the TPU worker group: numOfHosts, google.com/tpu, node selectors
        image=IMAGE,
        wait_timeout=900,
        **KUBE,
    )
    # [END howto_kuberay_create_cluster]
    # [START howto_kuberay_job_on_cluster]
    job = RaySubmitJobOperator(
        task_id="tpu_job",
        cluster=cluster.output,  # a reference: the task re-derives address and token from its cluster
        entrypoint=["python", "-c", "import ray; ray.init(); print(ray.cluster_resources())"],
    )
    # [END howto_kuberay_job_on_cluster]
    # [START howto_kuberay_delete_cluster]
    drop_ray = KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="create_ray_cluster", **KUBE)
    drop_pool = GKEDeleteNodePoolOperator(task_id="delete_pool", created_by_task_id="create_pool", **GKE)
    pool >> cluster >> job >> drop_ray.as_teardown(setups=cluster)
    drop_ray >> drop_pool.as_teardown(setups=pool)
    # [END howto_kuberay_delete_cluster]

with DAG("example_kuberay_service", schedule=None, start_date=datetime(2026, 11, 1), tags=["example"]):
    serve_pool = GKECreateTPUNodePoolOperator(task_id="create_pool", tpu_slice=SLICE, **GKE)
    # [START howto_kuberay_deploy_service]
    service = KubeRayDeployServiceOperator(
        task_id="deploy_service",
        tpu_slice=SLICE,
        image=IMAGE,
        serve_config={
            "applications": [
                {"name": "app", "route_prefix": "/app", "import_path": "my_models.chat:build_app", "args": {}}
            ]
        },
        upgrade_strategy="NewCluster",  # an update starts a new cluster and switches once it is ready
        on_kill_action="delete",
        wait_timeout=1800,
        **KUBE,
    )
    # [END howto_kuberay_deploy_service]
    # [START howto_kuberay_delete_service]
    drop_service = KubeRayDeleteServiceOperator(task_id="delete_service", service_task_id="deploy_service", **KUBE)
    drop_serve_pool = GKEDeleteNodePoolOperator(task_id="delete_pool", created_by_task_id="create_pool", **GKE)
    serve_pool >> service >> drop_service.as_teardown(setups=service)
    drop_service >> drop_serve_pool.as_teardown(setups=serve_pool)
    # [END howto_kuberay_delete_service]
