"""Airflow DAG: every hour, delete what finished, killed or expired pipeline runs left behind.

Node pools, RayClusters and RayServices (by tpuflow's ownership labels; nothing unlabelled is ever
touched), local Ray clusters and slice leases of runs that are not running, for every DAG built with
tpu_pipeline (found by its ``tpuflow`` tag in this DAG bundle, and by the record each run writes beside the slice
leases; no list of DAG ids to keep up to date), and
whatever a run whose supervising process was killed left, whatever its state. The GKE cluster and the
Kubernetes connection are the pipeline's Variables (tpuflow.pipeline.gke.variable_settings); with no
GKE project configured only local clusters and leases are looked at. Same as `tpuflow reap`.
"""

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from tpuflow.cost.operators import TPUReapOrphansOperator

with DAG(
    dag_id="tpuflow_reaper",
    schedule="@hourly",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
    tags=["tpuflow", "maintenance"],
    doc_md=__doc__,
    params={
        "older_than": Param("2h", type="string", title="Only resources at least this old (e.g. 30m, 2h, 1d)"),
        "dry_run": Param(False, type="boolean", title="Only list what would be deleted"),
        "dag_ids": Param(
            [],
            type="array",
            title="More DAGs whose runs own resources (every DAG tagged tpuflow, and every DAG with a run, is covered)",
        ),
    },
) as dag:
    gcp = "{{ var.value.get('tpuflow_gcp_conn_id', 'google_cloud_default') }}"
    TPUReapOrphansOperator(
        task_id="reap",
        dag_ids="{{ params.dag_ids }}",
        older_than="{{ params.older_than }}",
        dry_run="{{ params.dry_run }}",
        gcp_conn_id=gcp,
        project_id="{{ var.value.get('tpuflow_gke_project', '') }}",
        location="{{ var.value.get('tpuflow_gke_location', '') }}",
        cluster_name="{{ var.value.get('tpuflow_gke_cluster', '') }}",
        kubernetes_conn_id="{{ var.value.get('tpuflow_kubernetes_conn_id', '') }}",
        namespace="{{ var.value.get('tpuflow_kuberay_namespace', '') }}",
        output_root="{{ var.value.get('tpuflow_gke_output_root', '') }}",
    )
