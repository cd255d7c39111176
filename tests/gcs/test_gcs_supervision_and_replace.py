"""The GKE pipeline's gs:// stores of issue 45 on a real GCS server: the run supervision records beside the slice
leases (what `tpuflow reap` reads from a plain shell), and emptying a prep's folder before a rerun."""

from __future__ import annotations

from support.processes import dead_process_record

from tpuflow import liveness
from tpuflow.naming import owner_run_digest
from tpuflow.slices.supervision import SupervisionStore, dead_runs
from tpuflow.storage import read_text, remove_tree, write_text

DAG, RUN = "acme_forecast_daily", "manual__2026-12-05T00:00:00+00:00"


def test_supervision_records_on_gs(bucket: str) -> None:
    store = SupervisionStore(f"gs://{bucket}/outputs/_tpuflow/slice-leases")
    digest = owner_run_digest(DAG, RUN)
    store.record(DAG, RUN, "2026-12-05", dead_process_record())
    store.record(DAG, "live", "2026-12-06", liveness.process_record())
    # a lease beside them is not a record
    write_text(f"gs://{bucket}/outputs/_tpuflow/slice-leases/slot-0.json", '{"holder": "x"}')
    assert set(store.all()) == {digest, owner_run_digest(DAG, "live")}
    assert set(dead_runs(store)) == {digest}
    store.forget(digest)
    store.forget(digest)  # twice: nothing left to delete is no error
    assert set(store.all()) == {owner_run_digest(DAG, "live")}


def test_remove_tree_empties_a_prefix_and_nothing_beside_it(bucket: str) -> None:
    run = f"gs://{bucket}/outputs/dag/2026-12-05"
    for name in ("data/train/a.parquet", "data/heldout/b.parquet", "train/checkpoint_0/w.npy"):
        write_text(f"{run}/{name}", "x")
    write_text(f"{run}/data-other/c.txt", "x")  # shares the prefix's text, not its folder
    assert remove_tree(f"{run}/data") == 2
    assert read_text(f"{run}/data/train/a.parquet") is None
    assert read_text(f"{run}/train/checkpoint_0/w.npy") == "x" and read_text(f"{run}/data-other/c.txt") == "x"
    assert remove_tree(f"{run}/data") == 0
