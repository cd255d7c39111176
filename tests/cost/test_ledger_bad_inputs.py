"""Only finite prices are prices, and a run's ledger is always recorded: a price Variable with NaN or Infinity (JSON
lets both through) is refused in one line naming it, and the ledger task still records the run's chip-hours,
without money; a training job whose result claims a breakdown that is not seconds (a forged result line) still gets
its ledger, its time not split. Each left out with a warning, in the log and in the ledger's ``warnings``."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from cost_support import RunTaskInstance
from support.airflow_context import task_context

from tpuflow.cost.ledger import check_prices
from tpuflow.errors import UserInputError
from tpuflow.work_spans import WORK_SPAN_KEY

V6E_2X2 = {"generation": "v6e", "chips": 4, "num_slices": 1}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ('{"v6e": NaN}', "tpuflow_chip_hour_prices[v6e]"),
        ('{"v6e": Infinity}', "tpuflow_chip_hour_prices[v6e]"),
        ('{"v6e": {"us-east5-b": NaN, "*": 3}}', "tpuflow_chip_hour_prices[v6e][us-east5-b]"),
        ({"v6e": math.inf}, "tpuflow_chip_hour_prices[v6e]"),  # as a native template renders the Variable's JSON
    ],
)
def test_a_price_that_is_not_finite_is_refused_naming_it(value: Any, field: str) -> None:
    with pytest.raises(UserInputError, match=r"is invalid: give a price per chip-hour, a finite number >= 0") as err:
        check_prices(value)
    assert err.value.field == field


class RunWithWork(RunTaskInstance):
    """RunTaskInstance that also answers the ledger's pull of work spans (a list of task ids)."""

    def xcom_pull(self, task_ids: Any = None, key: str = "return_value", include_prior_dates: bool = False) -> Any:
        if isinstance(task_ids, list):
            return [self.others[(t, key)] for t in task_ids if (t, key) in self.others]
        return super().xcom_pull(task_ids, key, include_prior_dates)


def ledger_run(tmp_path: Path, *, prices: Any, breakdown: Any, fit_s: Any = 280.0) -> dict[str, Any]:
    """The local pipeline's ledger task over a slice that lived 400 s, 300 s of it training."""
    from tpuflow.cost.local import LocalWriteChipLedgerOperator

    t0 = time.time() - 400
    ti = RunWithWork(task_id="chip_ledger")
    ti.others[("stop_cluster", "return_value")] = {
        "name": "c", "started_at": t0, "ready_at": t0 + 20, "stopped_at": t0 + 400,
    }  # fmt: skip
    train_span = {"cause": "training", "started_at": t0 + 50, "ended_at": t0 + 350, "breakdown": breakdown}
    ti.others[("train", WORK_SPAN_KEY)] = train_span
    ledger = LocalWriteChipLedgerOperator(
        task_id="chip_ledger",
        slices=[{"role": "train", "tpu": V6E_2X2, "task_id": "stop_cluster", "work": {"train": "training"}}],
        trained={"fit_s": fit_s},
        output_dir=str(tmp_path),
        prices=prices,
    )
    return ledger.execute(task_context(ti))


def test_a_nan_price_and_a_forged_breakdown_still_record_the_ledger(tmp_path: Path) -> None:
    recorded = ledger_run(tmp_path, prices='{"v6e": NaN}', breakdown={"productive": "lots", "compile": 5})
    assert json.loads((tmp_path / "ledger.json").read_text()) == recorded  # strict JSON: no NaN anywhere
    (line,) = recorded["slices"]
    assert line["chip_hours"] == pytest.approx(4 * 400 / 3600, rel=1e-3)
    assert "cost" not in recorded and "cost" not in line  # no money from a price that is not one
    assert line["timeline"]["seconds"]["training"] == pytest.approx(300, abs=0.01)  # the time kept, not split
    warned = recorded["warnings"]
    assert any("tpuflow_chip_hour_prices[v6e]=nan is invalid" in w and "without money" in w for w in warned), warned
    assert any("train's training breakdown is not seconds" in w for w in warned), warned


@pytest.mark.parametrize(
    "breakdown",
    [{"productive": math.inf}, {"productive": -5.0}, ["productive", 200]],
    ids=["infinite", "negative", "not-a-mapping"],
)
def test_a_breakdown_that_is_not_seconds_is_left_out_with_a_warning(tmp_path: Path, breakdown: Any) -> None:
    recorded = ledger_run(tmp_path, prices="", breakdown=breakdown, fit_s=math.nan)
    assert json.loads((tmp_path / "ledger.json").read_text()) == recorded
    (line,) = recorded["slices"]
    assert line["timeline"]["seconds"]["training"] == pytest.approx(300, abs=0.01)
    assert recorded["training_chip_hours"] == 0 and len(recorded["warnings"]) == 2, recorded["warnings"]
