"""Airflow DAG (example): a slice lease around the cluster, so schedules, backfills and manual runs together
never hold more slices than an admin allows.

The how-to page docs/howto/slices.md includes the marked parts. Parsing it starts nothing.
"""

from datetime import datetime

from airflow.sdk import DAG

from tpuflow.local.operators import LocalRayCreateClusterOperator, LocalRayDeleteClusterOperator
from tpuflow.slices.operators import TPUAcquireSliceOperator, TPUReleaseSliceOperator
from tpuflow.tpu import TpuSlice

# [START howto_slice_argument]
SLICE = TpuSlice.from_spec("v6e", "2x4", machine_type="ct6e-standard-4t")
# or SLICE.to_dict(), or {"accelerator": "{{ params.accelerator }}", "topology": "{{ params.topology }}"}
# [END howto_slice_argument]

with DAG("example_slices", schedule="@daily", start_date=datetime(2026, 11, 1), catchup=False, tags=["example"]):
    # [START howto_slice_lease]
    acquire = TPUAcquireSliceOperator(
        task_id="acquire_slice",
        max_slices="{{ var.value.get('tpuflow_max_slices', 1) }}",  # changed without a deploy
        tpu_slice=SLICE,  # one lease per slice of its num_slices
        lease_root=None,  # default: ~/.tpuflow/slice-leases; gs://BUCKET/PREFIX on GKE
        deferrable=True,  # waits in the triggerer while every lease is taken
    )
    start = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice=SLICE)
    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output)
    release = TPUReleaseSliceOperator(task_id="release_slice")
    acquire >> start >> stop.as_teardown(setups=start)
    stop >> release.as_teardown(setups=acquire)
    # [END howto_slice_lease]
