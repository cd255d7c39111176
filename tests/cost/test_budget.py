"""The budget guard: the max_chip_hours Param, the estimate from the previous run's ledger, the refusal."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from cost_support import RunTaskInstance
from support.airflow_context import task_context

from tpuflow.cost.budget import check_max_chip_hours, estimate_chip_hours, max_run_seconds
from tpuflow.errors import UserInputError

V6E_4X4 = {"generation": "v6e", "chips": 16, "num_slices": 1}
V6E_1X1 = {"generation": "v6e", "chips": 1, "num_slices": 1}
PREVIOUS = {"slices": [{"role": "train", "seconds": 1800.0}, {"role": "serve", "seconds": 3600.0}]}


@pytest.mark.parametrize("bad", [0, -1, "0", "abc", True, float("nan"), float("inf"), [1]])
def test_max_chip_hours_rejects_non_positive_and_non_numbers(bad: Any) -> None:
    with pytest.raises(UserInputError) as err:
        check_max_chip_hours(bad)
    assert err.value.field == "params.max_chip_hours"


def test_max_chip_hours_accepts_numbers_and_none() -> None:
    assert check_max_chip_hours(None) is None and check_max_chip_hours("") is None
    assert check_max_chip_hours(2) == 2.0 and check_max_chip_hours("0.5") == 0.5


def test_validate_params_checks_the_budget() -> None:
    from tpuflow.pipeline.params import pipeline_params, validate_params

    params = {k: p.value for k, p in pipeline_params().items()}
    assert "max_chip_hours" in params and params["max_chip_hours"] is None
    validate_params({**params, "max_chip_hours": 3})
    with pytest.raises(UserInputError) as err:
        validate_params({**params, "max_chip_hours": -3})
    assert err.value.field == "params.max_chip_hours"


def test_estimate_is_chips_times_previous_durations() -> None:
    estimate, basis = estimate_chip_hours([{"role": "train", "chips": 16}, {"role": "serve", "chips": 1}], PREVIOUS)
    assert estimate == pytest.approx(16 * 0.5 + 1 * 1.0) and "1800" in basis
    assert estimate_chip_hours([{"role": "train", "chips": 16}], None)[0] is None
    assert estimate_chip_hours([{"role": "eval", "chips": 4}], PREVIOUS)[0] is None


def test_a_measured_previous_run_scales_its_training_by_the_steps_asked() -> None:
    # the previous run: 1800 s on the train slice, of which 1200 s were 1200 productive steps (1 s each)
    previous = {
        "slices": [{"role": "train", "seconds": 1800.0, "timeline": {"seconds": {"productive": 1200.0}}}],
        "goodput": {"steps": {"productive": 1200, "compile": 1}},
    }
    estimate, basis = estimate_chip_hours([{"role": "train", "chips": 16, "steps": "3000"}], previous)
    assert estimate == pytest.approx(16 * (600.0 + 3000 * 1.0) / 3600.0)  # its badput, then 3000 steps
    assert "600 s not training as measured + 3000 steps x 1.000 s" in basis
    # without the steps asked (or a measured previous run) the previous duration stands
    assert estimate_chip_hours([{"role": "train", "chips": 16}], previous)[0] == pytest.approx(8.0)
    unmeasured = {"slices": [{"role": "train", "seconds": 1800.0}]}
    assert estimate_chip_hours([{"role": "train", "chips": 16, "steps": 3000}], unmeasured)[0] == pytest.approx(8.0)


def test_the_estimate_is_from_the_newest_previous_run_that_billed_a_slice() -> None:
    from tpuflow.cost.budget import latest_billed_ledger

    def ledger(created: float | None, seconds: float) -> dict:
        return {"slices": [{"role": "train", "created_at": created, "seconds": seconds}]}

    older, newer, rejected = ledger(100.0, 60.0), ledger(900.0, 30.0), ledger(None, 0.0)
    # Airflow 3 gives several prior runs' values as a list, in no date order
    assert latest_billed_ledger([newer, rejected, older]) is newer and latest_billed_ledger(older) is older
    assert latest_billed_ledger([rejected]) is None and latest_billed_ledger(None) is None


def test_the_guard_refuses_steps_that_are_not_a_count() -> None:
    from tpuflow.cost.operators import TPUCheckChipBudgetOperator

    with pytest.raises(UserInputError) as err:
        TPUCheckChipBudgetOperator(task_id="g", slices=[{"role": "train", "tpu": V6E_4X4, "steps": "many"}])
    assert err.value.field == "slices[train].steps"


def guard(max_chip_hours: Any, over_budget: str = "fail") -> Any:
    from tpuflow.cost.operators import TPUCheckChipBudgetOperator

    return TPUCheckChipBudgetOperator(
        task_id="budget_guard",
        max_chip_hours=max_chip_hours,
        slices=[{"role": "train", "tpu": V6E_4X4}, {"role": "serve", "tpu": V6E_1X1}],
        over_budget=over_budget,
    )


def test_over_budget_ask_lets_the_guard_pass_and_the_approval_ask_with_the_estimate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.providers.standard.operators.hitl import ApprovalOperator
    from airflow.sdk import DAG

    from tpuflow.cost.approval import ChipBudgetApprovalOperator

    ti = RunTaskInstance(task_id="budget_guard", prior={"chip_ledger": PREVIOUS})
    verdict = guard(8, over_budget="ask").execute(task_context(ti))  # no exception: a person decides
    assert verdict["over_budget"] is True and verdict["over_budget_action"] == "ask"
    asked: list[str] = []
    monkeypatch.setattr(ApprovalOperator, "execute", lambda self, context: asked.append(self.body) or "waiting")
    for budget, expected in ((8, "waiting"), (10, {"asked": False})):
        # the approval computes the guard's decision again from the guard as the DAG defines it
        with DAG(f"budget_ask_{budget}", schedule=None):
            guard(budget, over_budget="ask")
            approval = ChipBudgetApprovalOperator(task_id="approve_budget")
        approver = RunTaskInstance(task_id="approve_budget", prior={"chip_ledger": PREVIOUS})
        assert approval.execute(task_context(approver)) == expected
    (body,) = asked  # within the budget nothing is asked
    assert "about **9.000 chip-hours**" in body and "max_chip_hours=8.0" in body and "train: 16 chips" in body
    with pytest.raises(UserInputError) as err:
        guard(8, over_budget="maybe")
    assert err.value.field == "over_budget"


def test_guard_refuses_a_run_the_previous_ledger_says_is_over_budget() -> None:
    ti = RunTaskInstance(task_id="budget_guard", prior={"chip_ledger": PREVIOUS})
    with pytest.raises(
        AirflowFailException, match=r"max_chip_hours=8.0.*about 9.000 chip-hours.*nothing was provisioned"
    ):
        guard(8).execute(task_context(ti))
    assert guard(10).execute(task_context(ti))["estimate"] == pytest.approx(9.0)


def test_guard_without_history_lets_the_run_go_held_to_the_admins_default_ceiling() -> None:
    first = RunTaskInstance(task_id="budget_guard")
    assert guard(0.01).execute(task_context(first))["estimate"] is None
    assert guard(None).execute(task_context(first)) == {
        "max_chip_hours": 100.0,  # no budget asked: the admin's ceiling (tpuflow_max_chip_hours, default 100)
        "estimate": None,
        "basis": "no previous run's ledger to estimate from",
        "max_run_seconds": {"train": 22500 + 900, "serve": 360000 + 900},  # the ceiling spent on each slice alone
        "over_budget": False,
        "over_budget_action": "fail",
    }


def test_guard_bounds_each_slices_life_by_the_budget_and_the_runs_timeout() -> None:
    """What the GKE pipeline's node pools get as maxRunDuration: GKE ends them even when Airflow is down."""
    from datetime import timedelta
    from types import SimpleNamespace

    ti = RunTaskInstance(task_id="budget_guard")
    # 16 chips x 0.5 h = 8 chip-hours: the whole budget on the 4x4 alone; the 1x1 could hold it 8 h
    assert guard(8).execute(task_context(ti))["max_run_seconds"] == {"train": 1800 + 900, "serve": 28800 + 900}
    ctx = {**task_context(ti), "dag": SimpleNamespace(dagrun_timeout=timedelta(hours=2))}
    assert guard(8).execute(ctx)["max_run_seconds"] == {"train": 1800 + 900, "serve": 7200 + 900}
    assert guard(None).execute(ctx)["max_run_seconds"] == {"train": 7200 + 900, "serve": 7200 + 900}
    assert max_run_seconds(0.001, 16) == 1 + 900  # rounded up, never 0


def test_guard_rejects_a_bad_static_budget_at_parse_time() -> None:
    with pytest.raises(UserInputError) as err:
        guard(-1)
    assert err.value.field == "max_chip_hours"


def test_budgeted_training_checks_the_training_arguments_at_parse_time() -> None:
    """RayTrainOperator(budget=ChipHourBudget(...)): the training's parse-time checks run as without a budget,
    the budget's own fields render with the task's, and a budget that is not a TrainingBudget is one line."""
    from tpuflow.cost.training import ChipHourBudget
    from tpuflow.rayjob.workload_operators import RayTrainOperator

    train = {
        "task_id": "train",
        "cluster": {"dashboard_url": "http://127.0.0.1:8265"},
        "framework": "jax",
        "train_loop": "my_pkg.fit:train_loop",
        "tpu_slice": {"accelerator": "v6e", "topology": "2x2"},
        "storage_path": "/tmp/ckpt",
        "run_name": "r",
        "budget": ChipHourBudget(max_chip_hours="{{ params.max_chip_hours }}", project_id="{{ params.project }}"),
    }
    op = RayTrainOperator(**train)
    assert isinstance(op.budget, ChipHourBudget) and op.budget.max_chip_hours == "{{ params.max_chip_hours }}"
    op.render_template_fields({"params": {"max_chip_hours": 2.5, "project": "p"}})
    assert (op.budget.max_chip_hours, op.budget.project_id) == ("2.5", "p")
    for field, bad in [("framework", "tensorflow"), ("poll_interval", -1), ("entrypoint", []), ("budget", 5.0)]:
        with pytest.raises(UserInputError) as err:
            RayTrainOperator(**{**train, field: bad})
        assert err.value.field == field
