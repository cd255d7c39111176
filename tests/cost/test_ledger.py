"""The chip-hour ledger: its arithmetic, prices, and a ledger read from the GKE stand-in's own operations."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cost_support import RunTaskInstance
from support.airflow_context import task_context
from support.gke_standin import CLUSTER, CONN_ID, PROJECT, ZONE

from tpuflow.cost.ledger import build_ledger, check_prices, pool_ready, pool_span, rfc3339_to_unix, slice_entry
from tpuflow.errors import UserInputError

V6E_2X4 = {"generation": "v6e", "chips": 8, "num_slices": 1}
V6E_1X1 = {"generation": "v6e", "chips": 1, "num_slices": 1}


def op(kind: str, pool: str, start: str, end: str | None = None, **extra: Any) -> dict[str, Any]:
    out = {
        "operationType": kind,
        "targetLink": f"https://container.googleapis.com/v1/projects/p/locations/z/clusters/c/nodePools/{pool}",
        "startTime": start,
        "status": "DONE" if end else "RUNNING",
        **extra,
    }
    if end:
        out["endTime"] = end
    return out


def test_pool_span_is_create_start_to_delete_end() -> None:
    ops = [
        op("CREATE_NODE_POOL", "a", "2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"),
        op("DELETE_NODE_POOL", "a", "2026-12-01T11:00:00Z", "2026-12-01T11:02:00.500Z"),
        op("CREATE_NODE_POOL", "b", "2026-12-01T09:00:00Z"),
    ]
    created, deleted = pool_span(ops, "a")
    assert created == rfc3339_to_unix("2026-12-01T10:00:00Z")
    assert deleted - created == pytest.approx(3720.5)
    assert pool_span(ops, "b") == (rfc3339_to_unix("2026-12-01T09:00:00Z"), None)
    # a failed delete did not end the bill
    failed = [*ops[:1], op("DELETE_NODE_POOL", "a", "2026-12-01T11:00:00Z", "2026-12-01T11:00:01Z", error={"code": 9})]
    assert pool_span(failed, "a")[1] is None


def test_a_create_that_failed_bills_nothing_so_a_zone_failover_bills_from_the_zone_it_landed_in() -> None:
    stockout = {"code": 8, "message": "GCE_STOCKOUT"}
    ops = [  # one pool tried in us-east5-a (stockout, the failed pool deleted), then created in us-east5-b
        op("CREATE_NODE_POOL", "a", "2026-12-01T10:00:00Z", "2026-12-01T10:10:00Z", error=stockout),
        op("DELETE_NODE_POOL", "a", "2026-12-01T10:10:00Z", "2026-12-01T10:11:00Z"),
        op("CREATE_NODE_POOL", "a", "2026-12-01T10:11:00Z", "2026-12-01T10:15:00Z"),
        op("DELETE_NODE_POOL", "a", "2026-12-01T11:00:00Z", "2026-12-01T11:01:00Z"),
        op("CREATE_NODE_POOL", "b", "2026-12-01T10:00:00Z", "2026-12-01T10:10:00Z", error=stockout),
        op("DELETE_NODE_POOL", "b", "2026-12-01T10:10:00Z", "2026-12-01T10:11:00Z"),
    ]
    assert pool_span(ops, "a") == (rfc3339_to_unix("2026-12-01T10:11:00Z"), rfc3339_to_unix("2026-12-01T11:01:00Z"))
    assert pool_ready(ops, "a") == rfc3339_to_unix("2026-12-01T10:15:00Z")
    # a pool whose nodes never ran: no start, so no chip-hours (slice_entry)
    assert pool_span(ops, "b")[0] is None
    assert slice_entry("train", "v6e", 8, None, rfc3339_to_unix("2026-12-01T10:11:00Z"), now=0)["chip_hours"] == 0


def test_ledger_totals_training_part_and_open_slices() -> None:
    train = slice_entry("train", "v6e", 8, 1000.0, 1000.0 + 1800, pools=["p"])
    serve = slice_entry("serve", "v6e", 1, 2000.0, None, now=2000.0 + 3600)
    ledger = build_ledger([train, serve], training_seconds=1500, training_chips=8)
    assert train["chip_hours"] == pytest.approx(4.0) and serve["chip_hours"] == pytest.approx(1.0)
    assert serve["open"] is True and ledger["open"] is True
    assert ledger["chip_hours"] == pytest.approx(5.0)
    assert ledger["training_chip_hours"] == pytest.approx(8 * 1500 / 3600)
    assert ledger["chip_hours_ratio"] == pytest.approx(5.0 / (8 * 1500 / 3600), abs=1e-3)
    assert "cost" not in ledger  # no prices: no money, never a guess


def test_prices_give_money_only_for_priced_generations() -> None:
    train = slice_entry("train", "v6e", 8, 0.0, 3600.0)
    serve = slice_entry("serve", "v5e", 1, 0.0, 3600.0)
    priced = build_ledger([train, serve], prices=check_prices('{"v6e": 2.5, "TPU-V5LITEPOD": 1}'))
    assert train["cost"] == pytest.approx(20.0) and priced["cost"] == pytest.approx(21.0)
    partial = build_ledger(
        [slice_entry("train", "v6e", 8, 0.0, 3600.0), slice_entry("serve", "v5e", 1, 0.0, 3600.0)],
        prices={"v6e": 2.5},
    )
    assert partial["cost"] is None and partial["slices"][0]["cost"] == pytest.approx(20.0)
    assert "cost" not in partial["slices"][1]


def test_a_zones_price_follows_the_zone_the_slice_landed_in() -> None:
    prices = check_prices('{"v6e": {"us-east5-b": 2.0, "*": 3.0}, "v5e": {"us-west4-a": 1.0}}')
    landed_b = {**slice_entry("train", "v6e", 8, 0.0, 3600.0), "zone": "us-east5-b"}
    landed_c = {**slice_entry("train", "v6e", 8, 0.0, 3600.0), "zone": "us-east5-c"}
    assert build_ledger([landed_b], prices=prices)["cost"] == pytest.approx(16.0)
    assert build_ledger([landed_c], prices=prices)["cost"] == pytest.approx(24.0)  # "*": any other zone
    # a zone with no price of its own and no "*": no money for that slice, and no total
    elsewhere = {**slice_entry("serve", "v5e", 1, 0.0, 3600.0), "zone": "us-east1-c"}
    assert build_ledger([landed_b, elsewhere], prices=prices)["cost"] is None and "cost" not in elsewhere


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ('{"v6e": {"us-east5-b": -2}}', "tpuflow_chip_hour_prices[v6e][us-east5-b]"),
        ('{"v6e": -1}', "tpuflow_chip_hour_prices[v6e]"),
        ('{"v6e": "cheap"}', "tpuflow_chip_hour_prices[v6e]"),
        ('{"v9": 1}', "tpuflow_chip_hour_prices"),
        ("not json", "tpuflow_chip_hour_prices"),
        ("[1, 2]", "tpuflow_chip_hour_prices"),
    ],
)
def test_bad_prices_name_the_variable(value: str, field: str) -> None:
    with pytest.raises(UserInputError) as err:
        check_prices(value)
    assert err.value.field == field


def test_ledger_equals_the_standins_create_and_delete_times(gke: Any, tmp_path: Path) -> None:
    from tpuflow.cost.operators import GKEWriteChipLedgerOperator
    from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator

    fast = {"poll_interval": 0.05, "retry_backoff": 0.05, "project_id": PROJECT, "location": ZONE}
    run = {"dag_id": "ledger_dag", "run_id": "manual__ledger"}
    create = GKECreateTPUNodePoolOperator(
        task_id="create_node_pool", cluster_name=CLUSTER, gcp_conn_id=CONN_ID, **fast,
        tpu_slice={"accelerator": "v6e", "topology": "2x4", "machine_type": "ct6e-standard-4t"},
    )  # fmt: skip
    create_ctx = task_context(**run, task_id="create_node_pool")
    create.execute(create_ctx)
    time.sleep(0.5)  # the slice is billed while it exists
    delete = GKEDeleteNodePoolOperator(
        task_id="delete_node_pool", cluster_name=CLUSTER, created_by_task_id="create_node_pool",
        gcp_conn_id=CONN_ID, **fast,
    )  # fmt: skip
    delete.execute(task_context(**run, task_id="delete_node_pool"))
    (tmp_path / "report.json").write_text(json.dumps({"accuracy": 1.0}))

    ti = RunTaskInstance(**run, task_id="chip_ledger")
    ti.others[("create_node_pool", "node_pool_names")] = create_ctx["ti"].xcoms["node_pool_names"]
    ledger_op = GKEWriteChipLedgerOperator(
        task_id="chip_ledger",
        slices=[
            {"role": "train", "tpu": V6E_2X4, "task_id": "create_node_pool"},
            {"role": "serve", "tpu": V6E_1X1, "task_id": "create_serve_node_pool"},
        ],
        trained={"fit_s": 0.25, "checkpoint": "x"},
        output_dir=str(tmp_path),
        prices='{"v6e": 2.0}',
        gcp_conn_id=CONN_ID,
        project_id=PROJECT,
        location=ZONE,
        cluster_name=CLUSTER,
    )
    ledger = ledger_op.execute(task_context(ti))

    # The stand-in's own record of the two operations
    ops = gke.state()["operations"]
    start = rfc3339_to_unix(next(o for o in ops if o["operationType"] == "CREATE_NODE_POOL")["startTime"])
    end = rfc3339_to_unix(next(o for o in ops if o["operationType"] == "DELETE_NODE_POOL")["endTime"])
    train = ledger["slices"][0]
    assert train["created_at"] == pytest.approx(start, abs=1.0)
    assert train["deleted_at"] == pytest.approx(end, abs=1.0)
    assert train["chip_hours"] == pytest.approx(8 * (end - start) / 3600, abs=8 / 3600)
    assert train["open"] is False and train["pools"] == create_ctx["ti"].xcoms["node_pool_names"]
    # no serve pool was made: nothing billed for it
    assert ledger["slices"][1]["chip_hours"] == 0 and ledger["slices"][1]["created_at"] is None
    assert ledger["training_chip_hours"] == pytest.approx(8 * 0.25 / 3600, abs=1e-6)
    assert ledger["cost"] == pytest.approx(2.0 * ledger["chip_hours"], abs=1e-3)
    # in report.json and ledger.json, beside what the report already held
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["accuracy"] == 1.0 and report["ledger"] == ledger
    assert json.loads((tmp_path / "ledger.json").read_text()) == ledger


def test_a_pool_gke_emptied_at_its_max_run_duration_is_billed_until_then_not_until_its_delete(
    gke: Any, tmp_path: Path
) -> None:
    """Airflow down longer than the pool's maxRunDuration: GKE ended the nodes, the teardown deleted the empty
    pool later; the chips were billed only while the nodes ran."""
    from tpuflow.cost.operators import GKEWriteChipLedgerOperator
    from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator

    fast = {"poll_interval": 0.05, "retry_backoff": 0.05, "project_id": PROJECT, "location": ZONE}
    run = {"dag_id": "reclaimed_dag", "run_id": "manual__reclaimed"}
    create = GKECreateTPUNodePoolOperator(
        task_id="make_slice", cluster_name=CLUSTER, gcp_conn_id=CONN_ID, max_run_duration=1, **fast,
        tpu_slice={"accelerator": "v6e", "topology": "2x4", "machine_type": "ct6e-standard-4t"},
    )  # fmt: skip
    create_ctx = task_context(**run, task_id="make_slice")
    made = create.execute(create_ctx)
    time.sleep(2.5)  # past the maxRunDuration: the stand-in, as GKE, deletes the nodes
    (pool,) = gke.node_pools()
    assert "maxRunDuration" in (pool.get("statusMessage") or ""), pool
    GKEDeleteNodePoolOperator(
        task_id="drop_slice", cluster_name=CLUSTER, created_by_task_id="make_slice", gcp_conn_id=CONN_ID, **fast
    ).execute(task_context(**run, task_id="drop_slice"))

    ti = RunTaskInstance(**run, task_id="ledger")
    ti.others[("make_slice", "node_pool_names")] = create_ctx["ti"].xcoms["node_pool_names"]
    ti.others[("make_slice", "return_value")] = made
    ledger = GKEWriteChipLedgerOperator(
        task_id="ledger", slices=[{"role": "train", "tpu": V6E_2X4, "task_id": "make_slice"}],
        output_dir=str(tmp_path), gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE, cluster_name=CLUSTER,
    ).execute(task_context(ti))  # fmt: skip

    ops = gke.state()["operations"]
    created = next(o for o in ops if o["operationType"] == "CREATE_NODE_POOL")
    start, ready = rfc3339_to_unix(created["startTime"]), rfc3339_to_unix(created["endTime"])
    end = rfc3339_to_unix(next(o for o in ops if o["operationType"] == "DELETE_NODE_POOL")["endTime"])
    (train,) = ledger["slices"]
    assert train["reclaimed_at"] == pytest.approx(ready + 1, abs=0.01) and train["deleted_at"] == pytest.approx(end)
    assert train["seconds"] == pytest.approx(ready + 1 - start, abs=0.01) and end - start > train["seconds"] + 1
    assert train["open"] is False
    assert sum(train["timeline"]["seconds"].values()) == pytest.approx(train["seconds"], abs=0.01)


def test_reclaimed_at_never_ends_a_bill_early() -> None:
    from tpuflow.cost.ledger import reclaimed_at

    assert reclaimed_at(100.0, 150.0, 60, now=999.0) is None  # deleted before GKE's deadline
    assert reclaimed_at(100.0, 200.0, 60, now=999.0) == 160.0
    assert reclaimed_at(100.0, None, 60, now=130.0) is None  # still within it: open
    assert reclaimed_at(100.0, None, 60, now=170.0) == 160.0
    assert reclaimed_at(None, 200.0, 60, now=999.0) is None and reclaimed_at(100.0, 200.0, None, now=999.0) is None
    line = slice_entry("train", "v6e", 8, 90.0, None, now=500.0, reclaimed=160.0)
    assert line["seconds"] == 70.0 and line["open"] is False and line["reclaimed_at"] == 160.0
